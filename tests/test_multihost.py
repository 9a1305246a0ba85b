"""multihost.decide_initialize (pure), the lost-peer message and the watching parent's verdicts;
the real-process preemption and dead-peer tests are in test_train.py."""
import os
import signal
import socket
import subprocess
import sys

import pytest

from big_vision_relu import multihost

NONE = dict(coordinator_address=None, num_processes=None, process_id=None, multihost=None)


def decide(env=None, **kw):
  return multihost.decide_initialize(**{**NONE, **kw}, env=env or {})


def test_a_single_host_never_initialises():
  assert not decide().initialize
  assert not decide({"TPU_WORKER_HOSTNAMES": "localhost"}).initialize
  assert not decide({"TPU_WORKER_HOSTNAMES": "10.0.0.2"}).initialize
  assert not decide(multihost=False).initialize
  assert not decide({"BVR_MULTIHOST": "0"}).initialize


def test_a_multihost_tpu_vm_initialises_with_auto_detection():
  """A Cloud TPU VM sets no variable that says it is one of several hosts: the launch scripts
  pass --multihost (from TPU_TYPE), and JAX finds the workers itself (all arguments None)."""
  for d in (decide(multihost=True), decide({"BVR_MULTIHOST": "1"}),
            decide({"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"})):
    assert d.initialize
    assert (d.coordinator_address, d.num_processes, d.process_id) == (None, None, None)
  # The flag wins over the environment.
  assert not decide({"BVR_MULTIHOST": "1"}, multihost=False).initialize


def test_explicit_flags():
  d = decide(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=1)
  assert d.initialize and (d.coordinator_address, d.num_processes, d.process_id) == (
      "127.0.0.1:1234", 2, 1)
  assert not decide(coordinator_address="h:1", num_processes=1, process_id=0).initialize


@pytest.mark.parametrize("kw,env,match", [
    (dict(coordinator_address="h:1"), {}, "go together"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2), {}, "must be in"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=0, multihost=False), {},
     "contradicts"),
    ({}, {"BVR_MULTIHOST": "yes"}, "BVR_MULTIHOST"),
])
def test_contradictions_fail_with_what_to_change(kw, env, match):
  with pytest.raises(ValueError, match=match):
    decide(env, **kw)


def test_latest_finalized_step_ignores_unfinished_saves(tmp_path):
  assert multihost.latest_finalized_step(tmp_path) is None
  for name in ("5", "10", "15.orbax-checkpoint-tmp-123", "3.corrupt-1"):
    (tmp_path / name).mkdir()
  assert multihost.latest_finalized_step(tmp_path) == 10
  line = multihost.peer_lost_message("process 1 sent no heartbeat for 61 s", 10, tmp_path)
  assert "\n" not in line and "Lost a peer" in line and f"checkpoint 10 in {tmp_path}" in line
  assert "starts over" in multihost.peer_lost_message("x", None, tmp_path)


def test_supervise_stays_a_single_process_without_a_job():
  """No fork for a single process, or when the flags are wrong (main reports that)."""
  for argv in ([], ["--config", "c.py", "--nomultihost"], ["--process_id=x"],
               ["--coordinator_address=h:1", "--num_processes=1", "--process_id=0"],
               ["--coordinator_address=h:1"]):
    multihost.supervise(argv, env={})
    assert multihost._report_fd is None


def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("ends,coordinator,expected", [
    ("exit 3", "dead", 3),
    ("exit 75", "dead", multihost.PEER_LOST_EXIT_CODE),  # PeerWatchdog: its own line
    ("abort", "dead", multihost.PEER_LOST_EXIT_CODE),  # the runtime's abort: process 0 is gone
    ("abort", "alive", 128 + signal.SIGABRT),  # an abort of its own: as it is
    ("abort as process 0", "dead", 128 + signal.SIGABRT),
    ("abort before joining", "dead", 128 + signal.SIGABRT),
    ("SIGTERM", "dead", 128 + signal.SIGTERM),  # stopped, not a lost peer
])
def test_the_watching_parent(tmp_path, capfd, ends, coordinator, expected):
  """supervise's parent: passes the trainer's end through, except an abort after joining when
  process 0 no longer accepts connections: then one line naming process 0 and the checkpoint."""
  (tmp_path / "7").mkdir()
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    address = f"127.0.0.1:{listener.getsockname()[1] if coordinator == 'alive' else _closed_port()}"
    reports = [dict(checkpoint_dir=str(tmp_path))]
    if ends != "abort before joining":
      reports.append(dict(joined=dict(process_index=0 if ends.endswith("process 0") else 1,
                                      coordinator=address)))
    how = {"exit 3": "sys.exit(3)", "exit 75": "sys.exit(75)", "SIGTERM": "os.kill(os.getpid(), 15)"
           }.get(ends, "os.abort()")
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", (
        "import json, os, sys\n"
        f"for r in {reports!r}: os.write({write_fd}, (json.dumps(r) + '\\n').encode())\n"
        f"{how}\n")], pass_fds=[write_fd])
    os.close(write_fd)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      assert multihost._watch(child.pid, read_fd) == expected
    finally:
      for s, handler in handlers.items():
        signal.signal(s, handler)
      child.returncode = 0  # reaped by _watch
  lines = [l for l in capfd.readouterr().err.splitlines() if l.startswith("error: Lost a peer")]
  if expected == multihost.PEER_LOST_EXIT_CODE and ends == "abort":
    assert lines == [f"error: Lost a peer process of this multi-process run (process 0, the "
                     f"coordinator at {address}, is unreachable: killed, or its host died); this "
                     f"process stops too. Re-running the same command resumes from checkpoint 7 "
                     f"in {tmp_path}."]
  else:
    assert lines == []
