"""The Fashion-MNIST study's archived runs as the report reads them: each run's final metrics,
its test-accuracy curve (for the recipe's convergence rules) and where it was trained; and the
Markdown cells the report and the recipe rules (`recipe`) share."""
from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Any

from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import archive as archive_lib
from big_vision_relu.experiments import plans, provenance, run_status
from big_vision_relu.experiments import sweep as sweep_lib
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist

ACCURACY = "test/prec@1"
TRANSFER = "fewshot/10shot_avg"


@dataclasses.dataclass(frozen=True)
class RunResult:
  """One archived run: its final metrics, its test-accuracy curve and where it was trained."""
  run: sweep_lib.Run
  status: str
  curve: dict[int, float]  # step -> test accuracy (steps > 1)
  total_steps: int | None
  transfer: float | None
  core_hours: float | None
  provenance: dict[str, Any]
  starts: provenance.Starts = ()  # the CPU of each start (`provenance.starts`)

  @property
  def accuracy(self) -> float | None:
    return self.curve[max(self.curve)] if self.status == "finished" and self.curve else None

  def accuracy_at(self, fraction: float) -> float | None:
    """Test accuracy at the evaluation nearest to `fraction` of the run (the earlier on a tie).
    Nearest, not "at or before": a `log_percent` schedule evaluates every ceil(p T) steps, so
    its 75% evaluation of a 9,375-step run is at step 7,032, just after 0.75 T = 7,031.25."""
    if self.total_steps is None or not self.curve:
      return None
    target = fraction * self.total_steps
    return self.curve[min(self.curve, key=lambda s: (abs(s - target), s))]

  @property
  def last_quarter_gain(self) -> float | None:
    """What the last quarter of training added (recipe rule (b)): the final test accuracy less
    that at 75% of the run; None for a run not finished."""
    at_75 = self.accuracy_at(0.75) if self.accuracy is not None else None
    return None if at_75 is None else self.accuracy - at_75


def load_run(archive: pathlib.Path, run: sweep_lib.Run) -> RunResult:
  directory = archive_lib.archived_dir(archive, run)
  row = run_status.collect_run(run, directory)
  records: dict[int, dict[str, Any]] = {}
  if (directory / "metrics.jsonl").exists():
    records = metrics_lib.read_metrics(directory)
  curve = {s: r[ACCURACY] for s, r in sorted(records.items()) if s > 1 and ACCURACY in r}
  values = run_status.last_values({s: r for s, r in records.items() if s > 1},
                                  (TRANSFER, "core_hours"))
  return RunResult(run, row.status, curve, row.total_steps, values.get(TRANSFER),
                   values.get("core_hours"), provenance.read_provenance(directory),
                   provenance.starts(directory))


def load_results(archive: pathlib.Path) -> list[RunResult]:
  """Every planned run's result (finished or not) from the archive."""
  return [load_run(archive, item.run) for item in plans.plan(fmnist.SWEEPS, fmnist.PHASES)]


def runs_by_seed(results: Sequence[RunResult], **args: Any) -> dict[int, RunResult]:
  """{seed: run} of the finished runs whose args match `args`."""
  want = fmnist.run(**args).args
  return {r.run.args["seed"]: r for r in results if r.accuracy is not None and all(
      r.run.args[k] == v for k, v in want.items() if k != "seed")}


def by_seed(results: Sequence[RunResult], **args: Any) -> dict[int, float]:
  """{seed: final test accuracy} of the finished runs whose args match `args`."""
  return {seed: r.accuracy for seed, r in runs_by_seed(results, **args).items()}


def pct(value: float | None, signed: bool = False) -> str:
  if value is None:
    return "-"
  return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
          *("| " + " | ".join(row) + " |" for row in rows), ""]
