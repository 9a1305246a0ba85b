"""multihost.decide_initialize (pure) and the lost-peer message; the real-process preemption and
dead-peer tests are in test_train.py."""
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
