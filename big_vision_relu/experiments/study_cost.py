"""What each phase of a study has cost so far and what is left of it, read from its archive.

Spent: the trainers' own `core_hours` (CPU seconds of the trainer processes over all their
starts, compilation included), summed over a phase's done runs. Left: every run not done, at
the core hours per training FLOP measured on the finished runs with the same patch size (on
all finished runs while none has it yet), times its FLOPs (matmuls only:
`cost.training_steps_and_flops`), less the share its parked checkpoint has trained. An
estimate, and a low one where it borrows another patch size's rate: evaluation and input do not
shrink with the matmul FLOPs.
"""
from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import archive as archive_lib
from big_vision_relu.experiments import cost, parking, plans, run_status
from big_vision_relu.experiments import sweep as sweep_lib


@dataclasses.dataclass(frozen=True)
class RunCost:
  """One planned run: done or not, what it cost (done) and what it needs (FLOPs, progress)."""
  phase: int
  patch: tuple[int, ...]
  train_pflops: float
  done: bool
  finished: bool  # done and not diverged: its cost is a whole run's
  core_hours: float | None  # spent (done runs with a record)
  trained_fraction: float  # parked step / total steps (0 for runs not started or done)


def run_cost(archive: pathlib.Path, item: plans.PlannedRun, *, image_size: int,
             channels: int) -> RunCost:
  """A planned run's cost record from the archive, its FLOPs counted on images of that shape."""
  config = sweep_lib.load_config(item.run)
  steps, flops = cost.training_steps_and_flops(config, image_size, channels)
  directory = archive_lib.archived_dir(archive, item.run)
  status = run_status.collect_run(item.run, directory).status
  done = status in archive_lib.DONE
  core_hours = None
  if done:
    values = run_status.last_values(metrics_lib.read_metrics(directory), ("core_hours",))
    core_hours = values.get("core_hours")
  parked = parking.newest_step(parking.parked_dir(archive, item.run.run_id))
  fraction = 0.0 if done or parked is None else min(parked / steps, 1.0)
  return RunCost(item.phase, tuple(config.model.patch_size), flops / 1e15, done,
                 status == "finished", core_hours, fraction)


def core_hours_per_pflop(costs: Sequence[RunCost]) -> dict[tuple[int, ...] | None, float]:
  """{patch: rate} over the finished runs with a core-hours record; key None: all of them."""
  groups: dict[tuple[int, ...] | None, list[RunCost]] = {}
  for c in costs:
    if c.finished and c.core_hours is not None:
      groups.setdefault(c.patch, []).append(c)
      groups.setdefault(None, []).append(c)
  return {key: sum(c.core_hours for c in group) / sum(c.train_pflops for c in group)
          for key, group in groups.items()}


def left(c: RunCost, rates: Mapping[tuple[int, ...] | None, float]) -> float | None:
  """Estimated core hours still to train run `c` (0 if done; None if no run has finished)."""
  if c.done:
    return 0.0
  rate = rates.get(c.patch, rates.get(None))
  return None if rate is None else rate * c.train_pflops * (1 - c.trained_fraction)


def _describe(phase: plans.Phase) -> str:
  sweep, selection = phase
  chosen = ", ".join(f"{k}={'/'.join(map(str, v)) if isinstance(v, tuple) else v}"
                     for k, v in selection.items())
  return f"{sweep}: {chosen or 'all'}"


def table(archive: pathlib.Path, sweeps: plans.Sweeps, phases: Sequence[plans.Phase], *,
          image_size: int, channels: int) -> list[str]:
  """A markdown table, one row per phase (of `sweeps`' runs) and a total: runs, done, core hours
  spent and left."""
  costs = [run_cost(archive, item, image_size=image_size, channels=channels)
           for item in plans.plan(sweeps, phases)]
  rates = core_hours_per_pflop(costs)
  lines = ["| phase | runs | done | core hours spent | core hours left (estimate) |",
           "|---|---|---|---|---|"]

  def row(name: str, group: Sequence[RunCost]) -> str:
    spent = sum(c.core_hours or 0.0 for c in group)
    todo = [left(c, rates) for c in group]
    rest = "-" if None in todo else f"{sum(todo):.1f}"
    return (f"| {name} | {len(group)} | {sum(c.done for c in group)} | {spent:.1f} | "
            f"{rest} |")
  for index, phase in enumerate(phases):
    lines.append(row(f"{index} ({_describe(phase)})", [c for c in costs if c.phase == index]))
  lines.append(row("**total**", costs))
  return [*lines, ""]
