"""Multi-process jobs: when to join one, how to leave it, and what a lost peer does.

Three things every multi-host run needs, kept out of the training loop (a fourth, what a
preemption notice does, is preemption.py):

- `decide_initialize` (pure, unit-tested) says whether and how this process calls
  `jax.distributed.initialize`: explicit `--coordinator_address` flags; `--multihost`,
  which the TPU launch scripts pass on a pod slice of more than one host (a Cloud TPU VM sets
  no environment variable that says so: JAX finds the other workers through the VM's metadata
  server); or a `TPU_WORKER_HOSTNAMES` list of more than one host (GKE sets it). A single
  host never initialises, so one-host runs keep working without a coordinator.
- `leave`: after training, every process leaves the job together, in a defined order (a
  barrier, then `jax.distributed.shutdown`), not each at its own interpreter exit.
- A lost peer: when a process dies (kill -9, a crashed or preempted host), every surviving
  process prints one line saying so and naming the checkpoint a re-run resumes from, then
  exits with status `PEER_LOST_EXIT_CODE`, instead of hanging in a collective until JAX's
  abort dump. Checkpoint steps are atomic (orbax), so a save that was in flight is simply
  absent, and the last finalised one is intact. Two mechanisms, because process 0 is special:
  - `PeerWatchdog` (a thread in the trainer) notices a peer that stops beating.
  - `supervise` covers process 0, which hosts JAX's coordination service: when it dies, the
    runtime client of every other process aborts the process at once (its own "another task
    died" message, from a C++ thread: no Python code runs), and jax 0.10 offers no way to
    intercept that (`jax.distributed.initialize` exposes no callback; the client binding's
    `missed_heartbeat_callback` dies with std::bad_cast before calling Python; the service's
    `recoverable` mode does not cover the service itself). So the entry point (`python -m
    big_vision_relu.train` of a multi-process run, on Linux) forks before JAX or TensorFlow is
    imported: the child trains; the parent, which holds no JAX runtime, waits for it. If the
    child of a process other than 0 is killed by a signal (the runtime's abort is SIGABRT)
    after joining the job and process 0 no longer accepts connections at the coordinator
    address, the parent prints the line (reading the newest finalised checkpoint step from
    disk) and exits with `PEER_LOST_EXIT_CODE`. Otherwise it ends as the child did: the same
    exit status, or 128 + N for a child killed by signal N. The parent forwards SIGTERM
    (preemption saves work as before), ignores SIGINT (a terminal's Ctrl-C reaches the child
    itself), and the child dies with it (PR_SET_PDEATHSIG): kill -9 of the process a launcher
    started still kills the trainer. The child tells the parent what it needs through a pipe:
    its process index and coordinator address once joined, and the checkpoint directory.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags, logging
from etils import epath

# JAX is imported where it is used: `supervise` forks before it is imported (a fork is only
# safe while the process has one thread), and it imports this module.

# A distinct status for "a peer died": launch scripts and sweep loops can tell it from a bug.
PEER_LOST_EXIT_CODE = 75  # EX_TEMPFAIL: re-running is the fix
# How long JAX's coordination service waits for a missing heartbeat before it aborts every
# process (its default is 100 s); PeerWatchdog's shorter timeout speaks first.
HEARTBEAT_TIMEOUT_SECONDS = 120


# ------------------------------------------------------------------ whether to initialise


@dataclasses.dataclass(frozen=True)
class Decision:
  """How to join a multi-process job; `initialize=False` means stay a single process."""
  initialize: bool
  reason: str
  # jax.distributed.initialize's arguments; all None = auto-detect (Cloud TPU VM, GKE, SLURM).
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None


def decide_initialize(*, coordinator_address: str | None, num_processes: int | None,
                      process_id: int | None, multihost: bool | None,
                      env: Mapping[str, str]) -> Decision:
  """Whether (and how) this process calls `jax.distributed.initialize`; no side effects.

  Args:
    coordinator_address, num_processes, process_id: the trainer's explicit flags.
    multihost: `--multihost`: True on every worker of a multi-host TPU VM (the launch scripts
      pass it), False to forbid initialising, None (not given) to decide from `env`.
    env: the environment (os.environ); `BVR_MULTIHOST=1|0` is the same as `--multihost`.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    if coordinator_address is None or num_processes is None or process_id is None:
      raise ValueError("--coordinator_address, --num_processes and --process_id go together; "
                       f"got {coordinator_address=}, {num_processes=}, {process_id=}.")
    if not 0 <= process_id < num_processes:
      raise ValueError(f"--process_id={process_id} must be in [0, {num_processes}).")
    if multihost is False:
      raise ValueError("--nomultihost contradicts --coordinator_address; drop one of them.")
    if num_processes == 1:
      return Decision(False, "--num_processes=1: a single process")
    return Decision(True, f"--coordinator_address={coordinator_address} "
                          f"(process {process_id} of {num_processes})",
                    coordinator_address, num_processes, process_id)
  if multihost is None and env.get("BVR_MULTIHOST", "") != "":
    value = env["BVR_MULTIHOST"]
    if value not in ("0", "1"):
      raise ValueError(f"BVR_MULTIHOST={value!r}: use 1 (a multi-host TPU VM) or 0.")
    multihost = value == "1"
  if multihost is not None:
    if multihost:
      return Decision(True, "--multihost: a multi-host TPU VM; JAX finds the workers itself")
    return Decision(False, "--nomultihost")
  hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
  if len(hosts) > 1:
    return Decision(True, f"TPU_WORKER_HOSTNAMES lists {len(hosts)} hosts")
  return Decision(False, "a single host (no --multihost, --coordinator_address or "
                         "multi-host TPU_WORKER_HOSTNAMES)")


# ------------------------------------------------------------------ a lost peer

_checkpoint_dir: epath.Path | None = None


def set_checkpoint_dir(directory: epath.PathLike | None) -> None:
  """Where the run's checkpoints are: named by the lost-peer message."""
  global _checkpoint_dir
  _checkpoint_dir = None if directory is None else epath.Path(directory)
  _report(checkpoint_dir=None if directory is None else os.fspath(directory))


def latest_finalized_step(directory: epath.PathLike | None) -> int | None:
  """The newest complete checkpoint step in `directory` (None if none), by listing it.

  orbax writes a step under a temporary name and renames it when complete (locally), or writes
  `commit_success.txt` last (GCS), so a save cut short is never counted.
  """
  if directory is None:
    return None
  path = epath.Path(directory)
  try:
    names = [p.name for p in path.iterdir()]
  except OSError:
    return None
  steps = sorted((int(n) for n in names if n.isdigit()), reverse=True)
  if "://" in os.fspath(path):
    steps = [s for s in steps if (path / str(s) / "commit_success.txt").exists()]
  return steps[0] if steps else None


def peer_lost_message(what: str, step: int | None, directory: epath.PathLike | None) -> str:
  """The one line a surviving process prints before it exits."""
  where = f" in {directory}" if directory is not None else ""
  resume = (f"Re-running the same command resumes from checkpoint {step}{where}"
            if step is not None else
            f"There is no checkpoint yet{where}: re-running the same command starts over")
  return (f"Lost a peer process of this multi-process run ({what}: killed, or its host "
          f"died); this process stops too. {resume}.")


class PeerWatchdog:
  """A thread that ends this process with one clear line once a peer stops beating.

  Every `interval` seconds each process bumps its own counter in the coordination service's
  key-value store and reads everyone's; a peer whose counter has not moved for `timeout`
  seconds (by this process's clock) is taken for dead: the line names it and the checkpoint a
  re-run resumes from, and the process exits with PEER_LOST_EXIT_CODE. `timeout` is shorter
  than the runtime's own heartbeat timeout, so this line comes before JAX's abort dump.

  Why not the runtime's missed_heartbeat_callback: jax.distributed.initialize does not expose
  it, and jaxlib 0.10's binding fails to pass the status to a Python callable
  (std::bad_cast, then terminate). If process 0 (which hosts the coordination service) dies,
  the others' runtime clients abort at once, before this thread can speak: `supervise`'s
  parent process prints the line then.

  os._exit, not sys.exit: the main thread may be blocked in a collective that can never
  complete, and nothing else (orbax's pending save, atexit's distributed shutdown) can finish;
  a save in flight is simply not finalised, so the last finalised checkpoint stays intact.
  """

  def __init__(self, *, interval: float = 5.0, timeout: float = 60.0) -> None:
    import jax  # noqa: PLC0415  (see the imports)
    from jax._src import distributed as jax_distributed  # noqa: PLC0415  (the job's client)
    self._client = jax_distributed.global_state.client
    self._interval, self._timeout = interval, timeout
    self._me, self._count = jax.process_index(), jax.process_count()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="PeerWatchdog", daemon=True)

  def __enter__(self) -> PeerWatchdog:
    if self._client is not None and self._count > 1:
      self._thread.start()
    return self

  def __exit__(self, *exc: object) -> None:
    """Stops watching; peers see this process as finished, not lost."""
    if not self._thread.is_alive():
      return
    self._stop.set()
    self._thread.join()
    try:
      self._client.key_value_set(f"big_vision_relu/done/{self._me}", "1", allow_overwrite=True)
    except Exception:  # noqa: BLE001  (the service may be gone already at the very end)
      pass

  def _run(self) -> None:
    beats = 0
    last_seen: dict[int, tuple[str, float]] = {}
    while not self._stop.wait(self._interval if beats else 0):
      beats += 1
      now = time.monotonic()
      try:
        self._client.key_value_set(f"big_vision_relu/alive/{self._me}", str(beats),
                                   allow_overwrite=True)
        alive = dict(self._client.key_value_dir_get("big_vision_relu/alive/"))
        done = dict(self._client.key_value_dir_get("big_vision_relu/done/"))
      except Exception as e:  # noqa: BLE001  (the coordination service is unreachable)
        if self._stop.is_set():
          return
        self._lost(f"the coordination service on process 0 is unreachable "
                   f"({_first_line(e)})")
      for peer in range(self._count):
        if peer == self._me or any(k.endswith(f"/{peer}") for k in done):
          continue
        value = next((v for k, v in alive.items() if k.endswith(f"/{peer}")), "")
        if peer not in last_seen or last_seen[peer][0] != value:
          last_seen[peer] = (value, now)
        elif now - last_seen[peer][1] > self._timeout:
          self._lost(f"process {peer} sent no heartbeat for {now - last_seen[peer][1]:.0f} s")

  def _lost(self, what: str) -> None:
    try:
      logging.error("%s", _print_peer_lost(what, _checkpoint_dir))
    finally:
      os._exit(PEER_LOST_EXIT_CODE)


def _print_peer_lost(what: str, directory: epath.PathLike | None) -> str:
  """Prints the lost-peer line (`error: ...`) to stderr; returns the message."""
  message = peer_lost_message(what, latest_finalized_step(directory), directory)
  print(f"error: {message}", file=sys.stderr, flush=True)
  return message


def _first_line(error: BaseException) -> str:
  """An exception's message as one line (gRPC's run over several)."""
  lines = str(error).strip().splitlines()
  return lines[0] if lines else type(error).__name__


def leave(timeout_s: float = 300.0) -> None:
  """Leaves the multi-process job: every process at one point, in a defined order.

  Without this, each process leaves at its own interpreter exit (jax's atexit hook:
  clear_backends, then jax.distributed.shutdown), whenever it gets there: one may still be in
  the last preemption vote's collective, an orbax barrier or its final writes while another
  has torn down its CPU collectives and left, and process 0 (whose service the others'
  runtime clients poll for errors) may stop the service while a peer's client is still in the
  shutdown barrier, which that runtime treats as a fatal error (abort, "Fatal Python error:
  Aborted"). So, after training:

  1. a barrier in the coordination service: every process has finished training, saving and
     its collectives (nothing of the job runs anywhere now);
  2. jax.distributed.shutdown() in every process: the runtime clients leave through the
     service's own shutdown barrier, then process 0 stops the service, all while the backends
     are still alive (atexit's shutdown is then a no-op).

  A peer that never reaches the barrier (it died meanwhile) is a lost peer: one line, exit
  PEER_LOST_EXIT_CODE. A single process returns at once.
  """
  import jax  # noqa: PLC0415  (see the imports)
  from jax._src import distributed as jax_distributed  # noqa: PLC0415  (the job's client)
  client = jax_distributed.global_state.client
  if client is None:
    return
  try:
    client.wait_at_barrier("big_vision_relu/leave", int(timeout_s * 1000))
  except Exception as e:  # noqa: BLE001  (a dead peer or coordinator: the runtime says which)
    logging.error("%s", _print_peer_lost(f"not every process reached the end of the run "
                                         f"({_first_line(e)})", _checkpoint_dir))
    os._exit(PEER_LOST_EXIT_CODE)
  jax.distributed.shutdown()


# ------------------------------------------------------------------ the watching parent

# In a trainer forked by `supervise`: the pipe to the watching parent (None otherwise).
_report_fd: int | None = None


def _report(**values: Any) -> None:
  """Tells the watching parent `values` (a JSON line); nothing without one. Never blocks."""
  if _report_fd is None:
    return
  try:
    os.write(_report_fd, (json.dumps(values) + "\n").encode())
  except OSError:  # the pipe is full (64 KB of reports) or the parent is gone
    pass


def supervise(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
  """In a multi-process run, forks: returns in the child, which trains; the parent watches.

  Call it first in an entry point's `__main__`, before JAX or TensorFlow is imported (a fork is
  only safe while the process has one thread). `argv`: the command-line flags; only the
  multi-process ones (`define_flags`) are read here. Returns without forking when
  `decide_initialize` says single process, when those flags do not parse (the entry point
  reports that), in a child already, or off Linux (no PR_SET_PDEATHSIG). The parent never
  returns: it exits as `_watch` decides (see the module docstring).
  """
  global _report_fd
  if _report_fd is not None or not sys.platform.startswith("linux"):
    return
  values = flags.FlagValues()
  define_flags(values)
  try:
    values(["supervise", *argv], known_only=True)
    decision = decide_initialize(
        coordinator_address=values.coordinator_address, num_processes=values.num_processes,
        process_id=values.process_id, multihost=values.multihost,
        env=os.environ if env is None else env)
  except (flags.Error, ValueError):
    return
  if not decision.initialize:
    return
  read_fd, write_fd = os.pipe()
  sys.stdout.flush()
  sys.stderr.flush()
  parent = os.getpid()
  child = os.fork()
  if child == 0:
    os.close(read_fd)
    _die_with(parent)
    os.set_blocking(write_fd, False)
    _report_fd = write_fd
    return
  os.close(write_fd)
  sys.exit(_watch(child, read_fd))


def _die_with(parent: int) -> None:
  """This (forked) process gets SIGKILL when `parent` dies, as if they were one process."""
  import ctypes  # noqa: PLC0415
  pr_set_pdeathsig = 1
  ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
  if os.getppid() != parent:  # it died before prctl took effect
    os.kill(os.getpid(), signal.SIGKILL)


def _watch(child: int, read_fd: int) -> int:
  """Waits for the trainer `child`; returns the exit status for this process."""
  done = False

  def forward(signum: int, frame: Any) -> None:
    del frame
    if not done:
      try:
        os.kill(child, signum)
      except ProcessLookupError:
        pass

  signal.signal(signal.SIGTERM, forward)  # a preemption notice: the trainer saves, exits 79
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the child (same process group)
  _, status = os.waitpid(child, 0)  # retried after a forwarded signal (PEP 475)
  done = True
  reports = _read_reports(read_fd)
  if os.WIFEXITED(status):
    return os.WEXITSTATUS(status)  # including PEER_LOST_EXIT_CODE: its line is printed
  killed_by = os.WTERMSIG(status)
  joined = reports.get("joined")
  if (killed_by not in (signal.SIGTERM, signal.SIGINT) and joined
      and joined.get("process_index") != 0 and joined.get("coordinator")
      and not _accepts_connections(joined["coordinator"])):
    # The runtime client aborted (SIGABRT: "the JAX distributed service detected fatal errors")
    # because the coordination service, in process 0, is gone.
    _print_peer_lost(f"process 0, the coordinator at {joined['coordinator']}, is unreachable",
                     reports.get("checkpoint_dir"))
    return PEER_LOST_EXIT_CODE
  return 128 + killed_by


def _read_reports(read_fd: int) -> dict[str, Any]:
  """What the child `_report`ed (the last value of each key); closes `read_fd`."""
  os.set_blocking(read_fd, False)  # a grandchild may hold the write end open
  data = b""
  try:
    while chunk := os.read(read_fd, 1 << 16):
      data += chunk
  except BlockingIOError:
    pass
  finally:
    os.close(read_fd)
  reports: dict[str, Any] = {}
  for line in data.decode(errors="replace").splitlines():
    try:
      reports.update(json.loads(line))
    except ValueError:
      pass
  return reports


def _accepts_connections(address: str, timeout: float = 10.0) -> bool:
  """Whether `host:port` accepts a TCP connection within `timeout` seconds."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
      return True
  except (OSError, ValueError):
    return False


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the multi-process flags every entry point takes (train, evaluate)."""
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process).",
                      flag_values=flag_values)
  flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process).",
                       flag_values=flag_values)
  flags.DEFINE_integer("process_id", None, "This process's index (multi-process).",
                       flag_values=flag_values)
  flags.DEFINE_bool("multihost", None, "Join a multi-host job (jax.distributed.initialize(), "
                    "auto-detected): launch/tpu/*.sh pass it on multi-host TPU VMs; "
                    "--nomultihost never joins. Default: only with --coordinator_address or "
                    "a multi-host TPU_WORKER_HOSTNAMES.", flag_values=flag_values)


def initialize_from_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """`initialize` with the flags of `define_flags`."""
  initialize(coordinator_address=values.coordinator_address,
             num_processes=values.num_processes, process_id=values.process_id,
             multihost=values.multihost)


def initialize(*, coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, multihost: bool | None = None,
               env: Mapping[str, str] | None = None) -> Decision:
  """Joins the multi-process job if `decide_initialize` says so; returns the decision."""
  decision = decide_initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               multihost=multihost, env=os.environ if env is None else env)
  logging.info("jax.distributed.initialize: %s (%s).",
               "yes" if decision.initialize else "no", decision.reason)
  if decision.initialize:
    import jax  # noqa: PLC0415  (see the imports)
    from jax._src import distributed as jax_distributed  # noqa: PLC0415  (the job's state)
    jax.distributed.initialize(decision.coordinator_address, decision.num_processes,
                               decision.process_id,
                               heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_SECONDS)
    state = jax_distributed.global_state  # what auto-detection found, too
    _report(joined=dict(process_index=state.process_id, coordinator=state.coordinator_address))
  return decision
