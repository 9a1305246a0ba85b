"""launch/tpu/*.sh's remote commands, run on local "workers" by a fake gcloud.

A fake `gcloud` first on PATH: its `tpu-vm ssh` runs the remote command with bash in a local
directory per worker (its HOME) and its `tpu-vm scp` copies there, so the remote shell lines
(quoting, nohup/background, the busy check, the sweep loop) really run. There a fake trainer
records its arguments and a `pgrep` wrapper only sees the fake workers' processes.
"""
import json
import os
import pathlib
import shutil
import signal
import sys
import time
import uuid

import pytest

from tpu_scripts import BUILD_FLAGS, DATA_DIR, FIG1, PREPARE, VM, ZP, fig1_runs
# The fixtures local_bin and sh come from tpu_scripts too (a plugin: tests/conftest.py).

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

if pos[:1] == ["storage"]:  # a bucket: FAKE_ROOT/gcs/<bucket>/<path>
  def local(url):
    return root / "gcs" / url.removeprefix("gs://")
  if pos[1] == "cp":
    local(pos[3]).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(pos[2], local(pos[3]))
  elif pos[1] == "cat":
    if not local(pos[2]).exists():
      sys.exit(f"ERROR: {{pos[2]}} matched no objects")
    sys.stdout.write(local(pos[2]).read_text())
  elif pos[1] == "ls":
    for path in sorted(local(pos[2]).iterdir()):
      print(pos[2].rstrip("/") + "/" + path.name)
  sys.exit(0)
if pos[:4] == ["compute", "tpus", "tpu-vm", "describe"]:
  if not (root / pos[4]).exists() or (root / pos[4] / "DELETED").exists():
    sys.exit(f"ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: {{pos[4]}}")
  print("READY")
  sys.exit(0)
if pos[:3] == ["compute", "tpus", "queued-resources"]:  # states from FAKE_QUEUED_STATES, in turn
  if pos[3] == "describe":
    seen = root / "queued_polls"
    n = int(seen.read_text()) if seen.exists() else 0
    seen.write_text(str(n + 1))
    states = os.environ["FAKE_QUEUED_STATES"].split(",")
    print(states[min(n, len(states) - 1)])
  sys.exit(0)
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
  elif pos[2] == "describe":
    if not running.exists():
      sys.exit(f"ERROR: The resource '{{pos[3]}}' was not found")
    print("RUNNING")
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
# when FAKE_TRAIN_FAIL is in their arguments. The bash one is fast; with FAKE_TRAIN_RESUME in
# its arguments it exits FAKE_TRAIN_RESUME_RC its first FAKE_TRAIN_RESUME_TIMES times (a lost
# peer, 75, or a preemption, 79). The Python one is a real python process (so its command line
# is a trainer's, for the busy check), sleeps FAKE_TRAIN_SECONDS and records a SIGTERM (then
# exits 79, saved and not finished, like the real trainer).
FAKE_TRAIN_BASH = '''#!/bin/bash
[ "$1 $2" = "-m big_vision_relu.train" ] || exit 99
shift 2
(IFS=$'\\t'; echo "start$IFS$$$IFS$PWD$IFS${TFDS_DATA_DIR-}$IFS$*") >> "$HOME/train_calls.tsv"
if [ -n "${FAKE_TRAIN_FAIL-}" ] && [[ " $* " == *"$FAKE_TRAIN_FAIL"* ]]; then exit 3; fi
if [ -n "${FAKE_TRAIN_RESUME-}" ] && [[ " $* " == *"$FAKE_TRAIN_RESUME"* ]]; then
  n=$(( $(cat "$HOME/resume_count" 2> /dev/null || echo 0) + 1 ))
  echo "$n" > "$HOME/resume_count"
  if (( n <= FAKE_TRAIN_RESUME_TIMES )); then
    echo "saved, not finished"
    exit "$FAKE_TRAIN_RESUME_RC"
  fi
fi
echo "trained $*"
'''

FAKE_TRAIN_PY = '''import os, signal, sys, time

def record(event, *args):
  fields = [event, str(os.getpid()), os.getcwd(), os.environ.get("TFDS_DATA_DIR", ""), *args]
  with open(os.path.join(os.environ["HOME"], "train_calls.tsv"), "a") as f:
    f.write("\\t".join(fields) + "\\n")

def on_sigterm(*_):
  record("sigterm")
  sys.exit(79)

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
    (worker_bin / "gcloud").symlink_to(gcloud)  # the workers' own, for `gcloud storage cp`
    curl = worker_bin / "curl"  # the metadata server's agent-worker-number: FAKE_WORKER's w<i>
    curl.write_text('#!/bin/bash\necho "${FAKE_WORKER##*-w}"\n')
    curl.chmod(0o755)
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
  summary = f"sweep fig1 on relu-test: 10 runs, 9 done; stopped: none; failed: {failing}"
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
    wait_for(lambda log=log: log.exists() and "5 runs, 5 done;" in log.read_text())
    assert [c["argv"][3] for c in cloud.train_calls(1, vm)] == expected


def test_fake_sweep_starts_on_the_other_vms_when_one_fails(sh, cloud):
  cloud.install_fake_trainer("tpu-b")
  result = sh("sweep.sh", FIG1, "--vms", "down-a,tpu-b", path_prefix=cloud.bin, env=cloud.env)
  assert result.returncode == 1
  assert "the sweep did not start on: down-a" in result.stderr
  log = cloud.home(0, "tpu-b") / "logs" / "fig1.log"
  wait_for(lambda: log.exists() and "5 runs, 5 done;" in log.read_text())


# A fake venv on the data VM: pip and the write probe (`-c`) record and succeed (the probe fails
# with FAKE_NO_WRITE); a build (`python -m MODULE`) logs its start and end
# with TMPDIR and cwd, takes a second, and fails when FAKE_FAIL is in its arguments. With
# FAKE_PROGRESS it takes 4 s, drawing a progress bar as TFDS's tqdm does (carriage returns).
FAKE_VM_TOOL = '''#!/bin/bash
echo "$(basename "$0") $*" >> "$HOME/calls.txt"
case "$1" in
  -c) [ -z "${FAKE_NO_WRITE-}" ]; exit ;;
  -m) [ "$2" = pip ] && exit 0 ;;
esac
echo "start $(date +%s.%N) $TMPDIR $PWD $*" >> "$HOME/builds.txt"
echo "building $*"
sleep 1
if [ -n "${FAKE_PROGRESS-}" ]; then
  for i in 1 2 3; do
    printf '\\rGenerating train examples...:  %d%%|#   | %d/300 ' $((i * 33)) $((i * 100)) >&2
    printf '[00:0%d<00:0%d, 100.00 examples/s]' $i $((3 - i)) >&2
    sleep 1
  done
  echo
fi
echo "end $(date +%s.%N) $*" >> "$HOME/builds.txt"
if [ -n "${FAKE_FAIL-}" ] && [[ " $* " == *"$FAKE_FAIL"* ]]; then
  echo "boom: $FAKE_FAIL"
  exit 3
fi
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
  assert calls[-1] == ["compute", "instances", "delete", VM, *ZP, "--quiet"]
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
                         f"{PREPARE} --datasets=cars196 {BUILD_FLAGS} "
                         "--manual_dir=gs://bucket/cars"}
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


def test_fake_data_vm_reports_progress_to_data_log_and_status_shows_it(sh, cloud):
  """A long build's progress bar (examples done, rate, ETA) reaches data.log every
  DATA_PROGRESS_SECONDS while it runs; status.sh --data shows each dataset's newest line."""
  home = install_fake_vm_venv(cloud)
  env = {**cloud.env, "FAKE_PROGRESS": "1", "DATA_PROGRESS_SECONDS": "1",
         "MANUAL_DIR": "gs://bucket/i21k"}
  result = sh("data.sh", "imagenet21k/winter2021", "cifar100", path_prefix=cloud.bin, env=env)
  assert result.returncode == 0, result.stderr
  log = (home / "logs" / "data.log").read_text()
  progress = [line for line in log.splitlines() if ": progress: " in line]
  for name in ("imagenet21k_winter2021", "cifar100"):
    mine = [line.split(": progress: ", 1)[1] for line in progress if f" {name}: " in line]
    assert mine, log
    for line in mine:  # one status of the bar, never the carriage-return history
      assert line.startswith("Generating train examples...:") and line.endswith(
          "100.00 examples/s]"), line
  assert "/300 [" in progress[-1] and "<" in progress[-1]  # done / total [elapsed<ETA, rate]
  assert f"data.sh: done, all in {DATA_DIR}" in result.stdout  # the progress loop was stopped

  # status.sh --data on a data VM that is still there: the newest line of each dataset.
  (cloud.root / VM / "RUNNING").write_text("")
  status = sh("status.sh", "--data", path_prefix=cloud.bin, env={**cloud.env, "TPU_NAME": None})
  assert status.returncode == 0, status.stderr
  shown = status.stdout.splitlines()
  assert shown[0] == "RUNNING"
  assert len(shown) == 4, shown
  assert sorted(line.split(" ", 2)[2] for line in shown[1:3]) == [  # started in either order
      "cifar100: ready", "imagenet21k/winter2021: ready"]
  assert shown[3] == f"== data.sh: done, all in {DATA_DIR}"
  (cloud.root / VM / "RUNNING").unlink()
  gone = sh("status.sh", "--data", path_prefix=cloud.bin, env=cloud.env)
  assert gone.returncode == 1 and "no data VM relu-vit-data" in gone.stderr


def test_fake_sweep_retries_lost_and_preempted_runs_and_keeps_logs_in_the_bucket(sh, cloud):
  """A run that exits 79 (preempted) twice is resumed and finishes on its third attempt; one
  that keeps exiting 75 (lost peer) stops after SWEEP_MAX_ATTEMPTS and is not counted done.
  Each worker's log reaches gs://BUCKET/logs/<VM>/worker<N>/ while the loop runs, and logs.sh
  reads it there once the VM is gone."""
  cloud.install_fake_trainer()
  runs = fig1_runs()
  env = {**cloud.env, "SWEEP_RETRY_SECONDS": "0", "LOG_SYNC_SECONDS": "1",
         "FAKE_TRAIN_RESUME": runs[2][0], "FAKE_TRAIN_RESUME_RC": "79",
         "FAKE_TRAIN_RESUME_TIMES": "2"}
  result = sh("sweep.sh", FIG1, path_prefix=cloud.bin, env=env)
  assert result.returncode == 0, result.stderr
  assert "copied to gs://bucket/logs/relu-test/worker<N>/" in result.stdout
  logs = [cloud.home(w) / "logs" / "fig1.log" for w in range(2)]
  summary = "sweep fig1 on relu-test: 10 runs, 10 done; stopped: none; failed: none"
  wait_for(lambda: all(log.exists() and summary in log.read_text() for log in logs))
  for worker in range(2):
    text = logs[worker].read_text()
    assert text.count(f"RETRY {runs[2][0]} (exit 79: preempted) in 0 s") == 2, text
    assert f"start {runs[2][0]} (attempt 3 of 3)" in text
    assert [c["argv"][3] for c in cloud.train_calls(worker)].count(
        f"gs://bucket/runs/{runs[2][0]}") == 3
  copies = [cloud.root / "gcs" / "bucket" / "logs" / "relu-test" / f"worker{w}" / "fig1.log"
            for w in range(2)]
  wait_for(lambda: all(c.exists() and c.read_text() == log.read_text()
                       for c, log in zip(copies, logs)))  # the last copy, after the loop ended

  # The VM is gone (preempted): logs.sh reads the bucket's copy.
  (cloud.root / "relu-test" / "DELETED").write_text("")
  gone = sh("logs.sh", "fig1", "--worker=1", "--lines=1", path_prefix=cloud.bin, env=cloud.env)
  assert gone.returncode == 0, gone.stderr
  assert "relu-test is not there" in gone.stderr
  assert gone.stdout.splitlines()[-1] == logs[1].read_text().splitlines()[-1]
  assert gone.stdout.splitlines()[-1].endswith(summary)
  listing = sh("logs.sh", "--worker=1", path_prefix=cloud.bin, env=cloud.env)
  assert "gs://bucket/logs/relu-test/worker1/fig1.log" in listing.stdout
  (cloud.root / "relu-test" / "DELETED").unlink()

  # A lost peer every time: SWEEP_MAX_ATTEMPTS attempts, then stopped, not done.
  for worker in range(2):
    (cloud.home(worker) / "resume_count").unlink()
  env.update(FAKE_TRAIN_RESUME=runs[5][0], FAKE_TRAIN_RESUME_RC="75",
             FAKE_TRAIN_RESUME_TIMES="9", SWEEP_MAX_ATTEMPTS="2")
  result = sh("sweep.sh", FIG1, path_prefix=cloud.bin, env=env)
  assert result.returncode == 0, result.stderr
  summary = f"10 runs, 9 done; stopped: {runs[5][0]}; failed: none"
  wait_for(lambda: all(summary in log.read_text() for log in logs))
  for log in logs:
    text = log.read_text()
    assert f"RETRY {runs[5][0]} (exit 75: a lost peer)" in text
    assert f"STOPPED {runs[5][0]} (exit 75, attempt 2): saved, not finished" in text


def test_fake_stop_during_a_sweep_ends_the_loop_without_a_retry(sh, cloud):
  """stop.sh: the loop hears SIGTERM first, the trainer saves and exits 79; the loop starts
  neither a retry nor the next run, and says which runs are not done."""
  cloud.install_fake_trainer(python=True)
  env = {**cloud.env, "FAKE_TRAIN_SECONDS": "60", "SWEEP_RETRY_SECONDS": "0"}
  result = sh("sweep.sh", FIG1, path_prefix=cloud.bin, env=env)
  assert result.returncode == 0, result.stderr
  wait_for(lambda: all(cloud.train_calls(w) for w in range(2)))
  stop = sh("stop.sh", path_prefix=cloud.bin, env=env)
  assert stop.returncode == 0, stop.stderr
  ids = " ".join(run_id for run_id, _ in fig1_runs())
  logs = [cloud.home(w) / "logs" / "fig1.log" for w in range(2)]
  wait_for(lambda: all(log.exists() and f"0 done; stopped: {ids}; failed: none" in
                       log.read_text() for log in logs))
  for worker in range(2):
    assert [c["event"] for c in cloud.train_calls(worker)] == ["start", "sigterm"]
    assert "RETRY" not in logs[worker].read_text()


@pytest.mark.parametrize("states,code,says", [
    ("WAITING_FOR_RESOURCES,PROVISIONING,ACTIVE", 0, "relu-test: ACTIVE"),
    ("WAITING_FOR_RESOURCES,FAILED", 1, "is FAILED, not ACTIVE"),
    ("WAITING_FOR_RESOURCES", 1, "is still WAITING_FOR_RESOURCES after 0 min; it stays queued")])
def test_fake_queued_create_waits_until_active(sh, cloud, states, code, says):
  env = {**cloud.env, "QUEUED": "1", "FAKE_QUEUED_STATES": states, "QUEUED_POLL_SECONDS": "1",
         "QUEUED_TIMEOUT_MINUTES": "0" if code and "FAILED" not in states else "5"}
  result = sh("create.sh", "--", "--reserved", path_prefix=cloud.bin, env=env)
  assert result.returncode == code, result.stderr
  assert says in (result.stdout if code == 0 else result.stderr)
  calls = gcloud_calls(cloud)
  assert calls[0][:4] == ["compute", "tpus", "queued-resources", "create"] and calls[0][-1] == (
      "--reserved")
  polls = [c for c in calls if c[3] == "describe"]
  assert len(polls) == (3 if code == 0 else 2 if "FAILED" in states else 1)
  if code == 0:
    assert "PROVISIONING, waiting for ACTIVE" in result.stderr
    assert "Next: bash launch/tpu/setup.sh" in result.stdout
