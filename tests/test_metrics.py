"""MetricWriter (jsonl + TensorBoard, process 0 only) and Progress (fake clock) tests."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from big_vision_relu import metrics
from big_vision_relu.metrics import JSONL_NAME, MetricWriter, Progress


def _write_run(workdir, **kw):
  writer = MetricWriter(workdir, **kw)
  writer.write_scalars(1, {"train/loss": 0.5, "lr": np.float32(0.25)})
  writer.write_scalars(1, {"eval/acc": jnp.float32(0.125)})  # same step: same line
  writer.write_scalars(2, {"train/loss": jnp.asarray(0.375), "examples_seen": 128})
  writer.flush()
  writer.write_scalars(3, {"train/loss": 0.0625})
  writer.close()


def test_jsonl_one_merged_line_per_step(tmp_path):
  _write_run(tmp_path)
  lines = (tmp_path / JSONL_NAME).read_text().splitlines()
  assert lines == [
    '{"step": 1, "train/loss": 0.5, "lr": 0.25, "eval/acc": 0.125}',
    '{"step": 2, "train/loss": 0.375, "examples_seen": 128}',
    '{"step": 3, "train/loss": 0.0625}',
  ]
  assert isinstance(json.loads(lines[1])["examples_seen"], int)


def test_jsonl_appends_across_writers(tmp_path):
  # A resumed run appends to the existing file instead of truncating it.
  with MetricWriter(tmp_path, asynchronous=False) as writer:
    writer.write_scalars(1, {"a": 1.0})
  with MetricWriter(tmp_path, asynchronous=False) as writer:
    writer.write_scalars(2, {"a": 2.0})
  lines = [json.loads(x) for x in (tmp_path / JSONL_NAME).read_text().splitlines()]
  assert lines == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}]


def test_tensorboard_events_hold_the_scalars(tmp_path):
  _write_run(tmp_path)
  assert list(tmp_path.glob("events.out.tfevents.*"))
  acc = event_accumulator.EventAccumulator(
    str(tmp_path), size_guidance={event_accumulator.TENSORS: 0}
  )
  acc.Reload()
  got = {
    tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
    for tag in acc.Tags()["tensors"]
  }
  assert got == {
    "train/loss": [(1, 0.5), (2, 0.375), (3, 0.0625)],
    "lr": [(1, 0.25)],
    "eval/acc": [(1, 0.125)],
    "examples_seen": [(2, 128.0)],
  }


def test_other_processes_write_nothing(tmp_path):
  workdir = tmp_path / "run"
  _write_run(workdir, process_index=1)
  assert not workdir.exists()


def test_write_errors(tmp_path):
  with MetricWriter(tmp_path, asynchronous=False) as writer:
    with pytest.raises(ValueError, match="scalar"):
      writer.write_scalars(1, {"vec": np.zeros(3)})
    writer.write_scalars(1, {"loss": 1.0})
    with pytest.raises(ValueError, match=r"\['loss'\] were already written at step 1"):
      writer.write_scalars(1, {"loss": 2.0})
    with pytest.raises(ValueError, match="reserved"):
      writer.write_scalars(2, {"step": 2})
  assert (tmp_path / JSONL_NAME).read_text() == '{"step": 1, "loss": 1.0}\n'


class FakeClock:
  def __init__(self, t=1000.0):
    self.t = t

  def __call__(self):
    return self.t


def test_progress_core_hours_and_throughput():
  clock = FakeClock()
  progress = Progress(
    total_steps=100, first_step=10, num_devices=8, examples_per_step=64, core_hours=1.5, clock=clock
  )
  assert progress.line(10) == ("step 10/100 (10.0%) | ? img/sec/core | ETA ? | 1.500 core hours")
  clock.t += 15.0  # 10 steps of training ...
  with progress.paused():
    clock.t += 5.0  # ... and an eval, excluded from the throughput only
  measured = progress.measure(20)
  assert measured["img/sec/core"] == pytest.approx(10 * 64 / 15 / 8)
  assert measured["core_hours"] == pytest.approx(1.5 + 8 * 20 / 3600)
  # ETA: 20 s of wall time for 10 steps, 80 steps to go.
  assert progress.line(20) == (
    "step 20/100 (20.0%) | 5.3 img/sec/core | ETA 0:02:40 | 1.544 core hours"
  )
  clock.t += 30.0
  assert progress.measure(30)["img/sec/core"] == pytest.approx(10 * 64 / 30 / 8)
  assert progress.core_hours() == pytest.approx(1.5 + 8 * 50 / 3600)


class PendingStep:
  """A dispatched training step: `jax.block_until_ready` calls this leaf's method, which is
  where the step's remaining time passes."""

  def __init__(self, clock, seconds):
    self.clock, self.seconds = clock, seconds

  def block_until_ready(self):
    self.clock.t += self.seconds
    self.seconds = 0.0
    return self


def test_progress_pause_waits_for_dispatched_steps():
  """An eval right after steps were dispatched: their run time is training time, not paused."""
  clock = FakeClock()
  progress = Progress(total_steps=100, first_step=0, num_devices=1, examples_per_step=10,
                      clock=clock)
  clock.t += 1.0  # dispatching 10 steps returns at once ...
  with progress.paused(wait_for={"params": PendingStep(clock, 9.0)}):  # ... they run 9 s more
    clock.t += 5.0  # the eval
  assert progress.measure(10)["img/sec/core"] == pytest.approx(10 * 10 / 10.0)


def test_progress_core_hours_survive_resume():
  clock = FakeClock()
  first = Progress(total_steps=1000, first_step=0, num_devices=4, examples_per_step=32, clock=clock)
  clock.t += 1800.0
  saved = first.core_hours()  # what the trainer stores in the checkpoint's extra dict
  assert saved == pytest.approx(2.0)
  clock.t += 7200.0  # the job is down; the next process starts later
  resumed = Progress(
    total_steps=1000,
    first_step=500,
    num_devices=4,
    examples_per_step=32,
    core_hours=saved,
    clock=clock,
  )
  clock.t += 900.0
  assert resumed.core_hours() == pytest.approx(2.0 + 4 * 0.25)


def test_progress_measure_needs_progress():
  clock = FakeClock()
  progress = Progress(total_steps=10, first_step=0, num_devices=1, examples_per_step=1, clock=clock)
  clock.t += 1.0
  with pytest.raises(ValueError, match="needs progress"):
    progress.measure(0)
  with pytest.raises(ValueError, match="must all be >= 1"):
    Progress(total_steps=10, first_step=0, num_devices=0, examples_per_step=1)


def test_progress_core_clock_counts_core_seconds_not_wall_time():
  """On CPU the trainer passes time.process_time: core hours follow CPU seconds, whatever the
  wall clock and the device count say (e.g. when other jobs share the cores)."""
  wall, cpu = FakeClock(), FakeClock()
  progress = Progress(total_steps=10, first_step=0, num_devices=1, examples_per_step=1,
                      core_hours=0.5, clock=wall, core_clock=cpu)
  wall.t += 7200.0  # two wall hours while the process got ...
  cpu.t += 1800.0  # ... half a core hour of CPU time
  assert progress.core_hours() == pytest.approx(0.5 + 0.5)


@pytest.mark.parametrize("kind,cores", [
    ("TPU v2", 1), ("TPU v3", 1), ("TPU v4", 2), ("TPU v5", 2), ("TPU v5p", 2),
    ("TPU v5 lite", 1), ("TPU v6 lite", 1), ("TPU v4 lite", 1), ("cpu", 1), ("NVIDIA H100", 1)])
def test_core_hours_count_tensorcores_on_every_generation(kind, cores):
  """v4 / v5p: one JAX device is a chip of 2 TensorCores, so core hours are twice device hours."""
  assert metrics.tensorcores_per_device(kind) == cores
