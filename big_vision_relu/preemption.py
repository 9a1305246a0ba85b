"""What a preemption notice does: every process of a run saves the same step and exits with
`PREEMPTED_EXIT_CODE` ("saved, not finished": re-running the same command resumes).

`PreemptionNotice`: SIGTERM (how a TPU VM announces a preemption or a maintenance
event, and what `launch/tpu/stop.sh` sends) sets a flag in the process that got it. In a
multi-process run the processes then agree, at the same step, that *some* process was
signalled, so that all of them save that step and exit with `PREEMPTED_EXIT_CODE` whether
every worker or only one got the signal (a notice at the run's last step is simply its end:
status 0). The agreement is a tiny collective (a max over one int per device) dispatched after
each step and read one step later, so it never makes the host wait for the device; a single
process skips it.

Why not JAX's own preemption service (`multihost_utils.reached_preemption_sync_point`,
which orbax's `reached_preemption` asks): it relies on a C++ SIGTERM handler installed by
`jax.distributed.initialize`, which any Python `signal.signal(SIGTERM, ...)` (ours, or a
library's) silently displaces, and its sync point is `max step + 1` computed from the last
step each process *reported*: a notice that arrives before the first step of a resumed run
computes a sync point the run has already passed, and it never fires.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# The trainer's exit status after a preemption notice: it saved a checkpoint but did not reach
# the last step. Not 0, so that a sweep loop or a scheduler does not count the run done; not
# multihost.PEER_LOST_EXIT_CODE (75, EX_TEMPFAIL), and outside sysexits.h's 64-78 and the shell's
# 128 + signal, so that no tool reads it as something else. Re-running resumes.
PREEMPTED_EXIT_CODE = 79

# Set by SIGTERM; one per process, so that a handler installed by main() before the job is
# joined and the trainer's own see the same notice.
_SIGTERM = threading.Event()


class SigtermHandler:
  """While entered (in the main thread), SIGTERM sets the process's preemption flag.

  Entering it again (main() around the trainer, the trainer itself) is harmless and takes the
  signal back if something replaced the handler in between; the outermost exit restores the
  previous handler and clears the flag. A notice that JAX's handler caught in between (during
  jax.distributed.initialize) is not seen: a window of milliseconds.
  """
  _depth = 0
  _previous: Any = None

  def __enter__(self) -> SigtermHandler:
    if threading.current_thread() is threading.main_thread():
      if SigtermHandler._depth == 0:
        SigtermHandler._previous = signal.signal(signal.SIGTERM, _set_sigterm)
      else:
        # It may have been replaced since the outer entry: jax.distributed.initialize installs
        # JAX's C++ preemption notifier over it, and signal.getsignal cannot tell (it reports
        # what Python last installed). Ours again (see the module docstring for why).
        signal.signal(signal.SIGTERM, _set_sigterm)
      SigtermHandler._depth += 1
      self._entered = True
    else:
      self._entered = False
    return self

  def __exit__(self, *exc: object) -> None:
    if not self._entered:
      return
    SigtermHandler._depth -= 1
    if SigtermHandler._depth == 0:
      signal.signal(signal.SIGTERM, SigtermHandler._previous)
      _SIGTERM.clear()

  @staticmethod
  def received() -> bool:
    return _SIGTERM.is_set()


def _set_sigterm(signum: int, frame: Any) -> None:
  del signum, frame
  _SIGTERM.set()


class PreemptionNotice:
  """`stop(step)`: True at the same step in every process once any process got SIGTERM.

  Call it once per step, after dispatching the step, in every process. Single process: the
  local flag. Several: this step's vote (the local flag) is dispatched as a max over one int32
  per device of `devices`, and the previous step's agreed result is returned: every process
  reads the same value at the same step, and the host never waits for the device (the previous
  vote ran behind the previous step, which is done or nearly so).
  """

  def __init__(self, devices: Any, received: Callable[[], bool] = SigtermHandler.received):
    self._received = received
    self._multi = jax.process_count() > 1
    self._pending: jax.Array | None = None
    if self._multi:
      devices = list(np.asarray(devices).flat)
      mesh = jax.sharding.Mesh(np.asarray(devices), ("votes",))
      self._sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("votes"))
      self._local = [d for d in devices if d.process_index == jax.process_index()]
      self._shape = (len(devices),)
      self._any = jax.jit(jnp.max, out_shardings=jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec()))

  def stop(self, step: int) -> bool:
    del step  # every process calls this once per step, so the call order is the step order
    if not self._multi:
      return self._received()
    vote = np.array([int(self._received())], np.int32)
    votes = jax.make_array_from_single_device_arrays(
        self._shape, self._sharding, [jax.device_put(vote, d) for d in self._local])
    agreed, self._pending = self._pending, self._any(votes)
    return agreed is not None and bool(np.asarray(agreed))

  def close(self) -> None:
    """Waits for the last vote's collective, so that none is in flight when the job is left."""
    if self._pending is not None:
      self._pending.block_until_ready()
      self._pending = None
