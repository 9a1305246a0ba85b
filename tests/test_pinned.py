"""big_vision_relu.experiments.pinned: the study's launcher of trainers (core, niceness,
parent-death signal), started as the study starts it."""
import os
import pathlib
import signal
import subprocess
import sys
import time

from big_vision_relu.experiments import study
from trainer_processes import alive

ROOT = pathlib.Path(__file__).resolve().parents[1]
PINNED = list(study.PINNED_LAUNCHER)
# Prints what the exec'd command inherited: its CPUs, niceness and parent-death signal.
REPORT = """
import ctypes, os
libc = ctypes.CDLL(None)
signal = ctypes.c_int()
libc.prctl(2, ctypes.byref(signal))  # PR_GET_PDEATHSIG
print(",".join(map(str, sorted(os.sched_getaffinity(0)))), os.nice(0), signal.value)
"""


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([*PINNED, *args], cwd=ROOT, capture_output=True, text=True, check=False,
                        timeout=60)


def test_the_command_runs_on_its_core_niced_with_sigterm_on_parent_death():
  core = max(os.sched_getaffinity(0))
  done = _run(f"--core={core}", "--niceness=3", "--", sys.executable, "-c", REPORT)
  assert done.returncode == 0, done.stderr
  niced = min(os.nice(0) + 3, 19)  # the kernel caps niceness at 19 (a suite run at nice 19)
  assert done.stdout.split() == [str(core), str(niced), str(int(signal.SIGTERM))]


def test_without_a_core_the_command_keeps_the_cpus_and_the_exit_code():
  done = _run("--", sys.executable, "-c", REPORT + "raise SystemExit(7)")
  assert done.returncode == 7
  cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
  assert done.stdout.split() == [cpus, str(os.nice(0)), str(int(signal.SIGTERM))]


def test_the_command_is_stopped_when_its_parent_is_killed():
  parent = subprocess.Popen(
      [sys.executable, "-c", "import subprocess, sys\n"
       f"child = subprocess.Popen({PINNED!r} + ['--', 'sleep', '600'])\n"
       "print(child.pid, flush=True)\nchild.wait()"],
      cwd=ROOT, stdout=subprocess.PIPE, text=True)
  child_pid = int(parent.stdout.readline())
  deadline = time.monotonic() + 30
  while _command_line(child_pid) != b"sleep\x00600\x00":  # until the launcher has exec'd
    assert time.monotonic() < deadline, "the launcher did not exec its command"
    time.sleep(0.05)
  parent.kill()
  parent.wait()
  while alive(child_pid):
    assert time.monotonic() < deadline, "the command outlived its killed parent"
    time.sleep(0.05)


def test_it_runs_whatever_tree_the_command_runs_from(tmp_path):
  """A pinned study's trainers run with cwd and PYTHONPATH at an older commit's tree, whose
  big_vision_relu has no experiments package: the launcher still starts, and the command
  imports that tree's package."""
  package = tmp_path / "big_vision_relu"
  package.mkdir()
  (package / "__init__.py").write_text("")
  done = subprocess.run(
      [*PINNED, "--", sys.executable, "-c", "import big_vision_relu as p; print(p.__file__)"],
      cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True,
      text=True, check=False, timeout=60)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == str(package / "__init__.py")


def test_a_missing_command_is_a_usage_error():
  done = _run("--core=0")
  assert done.returncode != 0 and "No command to run" in done.stderr


def _command_line(pid: int) -> bytes:
  try:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
  except FileNotFoundError:
    return b""
