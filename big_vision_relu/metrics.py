"""Metric writing and progress accounting for the trainer.

`MetricWriter` writes, on process 0 only, every scalar to

- TensorBoard event files in the workdir (clu's `SummaryWriter`, asynchronous), also echoed
  to the log by clu's `LoggingWriter`, when clu is installed (it needs TensorFlow; without it,
  e.g. on a GPU machine with the memory pipeline, there are no event files and a warning says
  so: TensorBoard can be fed from metrics.jsonl later);
- `<workdir>/metrics.jsonl`, always: one JSON object per logged step, `{"step": s, name: value,
  ...}` with every scalar written at that step. Writes for the same step are merged: the
  line is held back until a write for another step, `MetricWriter.flush` or
  `MetricWriter.close`. So write all of a step's metrics (train, evals) before
  flushing; a write for an already-flushed step starts a second line for it.

Other processes write nothing. On resume, steps between the restored checkpoint and the
preemption are logged again, so `metrics.jsonl` may hold two lines for such a step: the
later line is the one of the surviving run. Non-finite values are written as `NaN` /
`Infinity` (Python's `json` reads them back).

`Progress` measures `img/sec/core` (examples per second per device, excluding
time spent in `Progress.paused` blocks such as evals) and `core_hours` (devices x
wall-clock hours on accelerators, the process's CPU time on the CPU backend; cumulative over
restarts: pass the checkpointed value back in), and formats the console line with the ETA.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from absl import logging
from etils import epath

JSONL_NAME = "metrics.jsonl"


def _to_python_scalar(name: str, value: Any) -> int | float | bool:
  """A Python number from a Python/NumPy/JAX scalar (fetches device values to the host)."""
  array = np.asarray(value)
  if array.ndim != 0:
    raise ValueError(f"metric {name!r} must be a scalar, got shape {array.shape}")
  return array.item()


class MetricWriter:
  """TensorBoard + `metrics.jsonl` writer that is active on process 0 only."""

  def __init__(
    self,
    workdir: str | os.PathLike[str],
    *,
    process_index: int | None = None,
    asynchronous: bool = True,
  ) -> None:
    """Creates the writers (process 0) or a no-op writer (other processes).

    Args:
      workdir: run directory (local or `gs://`) for event files and `metrics.jsonl`.
      process_index: this process's index; default `jax.process_index()`.
      asynchronous: write TensorBoard events in a background thread (clu's default).
    """
    index = jax.process_index() if process_index is None else process_index
    self.active = index == 0
    self._step: int | None = None
    self._pending: dict[str, int | float | bool] = {}
    if self.active:
      workdir = epath.Path(workdir)
      workdir.mkdir(parents=True, exist_ok=True)
      self._jsonl = workdir / JSONL_NAME
      self._writer = _event_writer(workdir, asynchronous)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Logs scalars at `step`; several calls for one step make one jsonl line."""
    if not self.active:
      return
    values = {name: _to_python_scalar(name, v) for name, v in scalars.items()}
    if "step" in values:
      raise ValueError("'step' is reserved in metrics.jsonl; rename the metric")
    if step != self._step:
      self._write_pending()
      self._step = int(step)
    duplicates = sorted(set(values) & set(self._pending))
    if duplicates:
      raise ValueError(f"metrics {duplicates} were already written at step {step}")
    self._pending.update(values)
    if self._writer is not None:
      self._writer.write_scalars(int(step), values)

  def _write_pending(self) -> None:
    if not self._pending:
      return
    line = json.dumps({"step": self._step, **self._pending})
    # Open/append/close per line: the line is durable even if the job dies right after,
    # and epath's append also works on gs:// (gfile rewrites the object).
    with self._jsonl.open("a") as f:
      f.write(line + "\n")
    self._pending = {}

  def flush(self) -> None:
    """Writes the held-back jsonl line and waits for pending TensorBoard writes."""
    if not self.active:
      return
    self._write_pending()
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    """Flushes and closes the event file."""
    if not self.active:
      return
    self._write_pending()
    if self._writer is not None:
      self._writer.close()

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()


def _event_writer(workdir: epath.Path, asynchronous: bool) -> Any:
  """clu's default writer (TensorBoard events + log lines), or None where clu is missing."""
  try:
    # Imported here: clu loads TensorFlow (seconds), which readers of metrics.jsonl (the
    # study's run status) and TensorFlow-free machines do without.
    from clu import metric_writers  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning("clu is not installed: no TensorBoard events in %s (metrics.jsonl has "
                    "every metric).", workdir)
    return None
  return metric_writers.create_default_writer(os.fspath(workdir), asynchronous=asynchronous)


def parse_metrics(lines: Iterable[str], name: str = JSONL_NAME) -> dict[int, dict[str, Any]]:
  """{step: {metric: value}} from metrics.jsonl lines, in increasing step order.

  The one reader of metrics.jsonl. A line for step s drops the records of steps > s (a resumed
  run logs the steps after its checkpoint again and supersedes them) and then updates record s,
  so a step's later line wins. Unparseable lines (a write cut off by preemption) are skipped
  with a warning.
  """
  records: dict[int, dict[str, Any]] = {}
  max_step = -1
  for number, line in enumerate(lines, 1):
    line = line.strip()
    if not line:
      continue
    try:
      record = json.loads(line)
      step = int(record.pop("step"))
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
      logging.warning("%s:%d: skipping an unparseable line: %.80s", name, number, line)
      continue
    if step < max_step:
      for stale in [s for s in records if s > step]:
        del records[stale]
    max_step = step
    records.setdefault(step, {}).update(record)
  return dict(sorted(records.items()))


def read_metrics(workdir: str | epath.PathLike) -> dict[int, dict[str, Any]]:
  """`<workdir>/metrics.jsonl` as {step: {metric: value}} (`parse_metrics`)."""
  path = epath.Path(workdir) / JSONL_NAME
  return parse_metrics(path.read_text().splitlines(), name=str(path))


def tensorcores_per_device(device_kind: str) -> int:
  """TensorCores behind one JAX device of this kind: the paper's "core" (core hours, img/sec/core).

  v4 and v5p chips have 2 TensorCores that JAX shows as one device (megacore); v2 and v3 show
  each TensorCore as a device; v5e / v6e ("lite") chips have one. Anything else (CPU, GPU): 1.
  """
  kind = device_kind.lower()
  if "lite" not in kind and kind.startswith(("tpu v4", "tpu v5")):
    return 2
  return 1


class Progress:
  """Throughput, ETA and cumulative core hours of a run, from an injectable clock."""

  def __init__(
    self,
    *,
    total_steps: int,
    first_step: int,
    num_devices: int,
    examples_per_step: int,
    core_hours: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    core_clock: Callable[[], float] | None = None,
  ) -> None:
    """Starts timing now (`clock()`).

    Args:
      total_steps: the run's last step, for the ETA and percentage.
      first_step: the step the loop starts from (the restored step, or 0).
      num_devices: TensorCores of the whole job (`jax.device_count()` times
        `tensorcores_per_device`), i.e. the cores.
      examples_per_step: global batch size.
      core_hours: core hours spent before this process (from the checkpoint; 0 if new).
      clock: seconds, monotonic; injectable for tests.
      core_clock: core-seconds consumed, when devices x wall time is not the truth: on the CPU
        backend one device is all the cores the process may use, so the trainer passes
        `time.process_time` (CPU seconds of all its threads), which also stays right when other
        jobs share the cores. None: core hours are num_devices x wall (`clock`) hours.
    """
    if min(total_steps, num_devices, examples_per_step) < 1:
      raise ValueError(
        f"total_steps={total_steps}, num_devices={num_devices} and "
        f"examples_per_step={examples_per_step} must all be >= 1"
      )
    self.total_steps = total_steps
    self.first_step = first_step
    self.num_devices = num_devices
    self.examples_per_step = examples_per_step
    self._core_hours_before = float(core_hours)
    self._clock = clock
    self._start = clock()
    self._core_clock = core_clock
    self._core_start = core_clock() if core_clock else None
    self._last_time = self._start
    self._last_step = first_step
    self._paused_seconds = 0.0  # paused time since the last measure()
    self._img_per_sec_core: float | None = None

  @contextlib.contextmanager
  def paused(self, wait_for: Any = None) -> Iterator[None]:
    """Time inside is excluded from img/sec/core (evals, checkpointing); still in core_hours.

    Args:
      wait_for: the training state (a pytree of arrays). JAX dispatches steps asynchronously:
        the pause starts only once they have run, else their time would count as paused and
        img/sec/core would read high when evaluations are dense.
    """
    jax.block_until_ready(wait_for)
    start = self._clock()
    try:
      yield
    finally:
      self._paused_seconds += self._clock() - start

  def core_hours(self) -> float:
    """Earlier runs (`core_hours` argument) plus this process: devices x wall hours, or the
    advance of `core_clock` when given."""
    if self._core_clock is not None:
      return self._core_hours_before + (self._core_clock() - self._core_start) / 3600
    return self._core_hours_before + self.num_devices * (self._clock() - self._start) / 3600

  def measure(self, step: int) -> dict[str, float]:
    """`img/sec/core` over the steps since the previous call, and `core_hours`.

    The first interval of a process includes compilation, so it reads low.
    """
    now = self._clock()
    busy = now - self._last_time - self._paused_seconds
    steps = step - self._last_step
    if steps <= 0 or busy <= 0:
      raise ValueError(
        f"measure({step}) needs progress since step {self._last_step} and "
        f"unpaused time (got {busy:.3g} s)"
      )
    self._img_per_sec_core = steps * self.examples_per_step / busy / self.num_devices
    self._last_time, self._last_step, self._paused_seconds = now, step, 0.0
    return {"img/sec/core": self._img_per_sec_core, "core_hours": self.core_hours()}

  def line(self, step: int) -> str:
    """Console line: step/total, percentage, last img/sec/core, ETA, core hours.

    The ETA extrapolates this process's average wall time per step (pauses included).
    """
    done = step - self.first_step
    elapsed = self._clock() - self._start
    if done > 0:
      eta_seconds = round((self.total_steps - step) * elapsed / done)
      eta = _format_duration(eta_seconds)
    else:
      eta = "?"
    rate = "?" if self._img_per_sec_core is None else f"{self._img_per_sec_core:.1f}"
    return (
      f"step {step}/{self.total_steps} ({100 * step / self.total_steps:.1f}%) | "
      f"{rate} img/sec/core | ETA {eta} | {self.core_hours():.3f} core hours"
    )


def _format_duration(seconds: int) -> str:
  hours, rest = divmod(max(seconds, 0), 3600)
  minutes, secs = divmod(rest, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}"
