r"""A sweep's runs and how far each got, from their workdirs: the rows every report is made of.

Kept apart from the tables and figures (and matplotlib) so that the study can ask for its runs'
status cheaply.

What is read. A run's workdir is `<root>/runs/<run id>` (`sweep.workdir`: one per run, shared by
every sweep that lists it). From it:

- `metrics.jsonl`, one JSON object per logged step (`big_vision_relu.metrics`). Lines are
  replayed in file order: a line for step s first drops every record of a step > s (those were
  logged by a run that was preempted and later resumed from an earlier checkpoint: the resumed
  run supersedes them), then updates record s key by key, so when a step appears twice the
  later line wins. Unparseable lines (e.g. a half-written last line) are skipped with a warning.
- `config.json` (the trainer writes it): for the run's total number of steps.

For each metric of `spec_metrics(spec)` a row holds its LAST logged value: the value at the
highest step that logged it (evaluators log less often than the training loss, so these steps
may differ). Evaluations at step 1 (the trainer evaluates the initialisation) are not results:
accuracies and few-shot values are taken from steps > 1 only.

- the spec's `accuracy_metric` (the paper: `i1k/prec@1`, ImageNet-1k top-1 accuracy, of the 21k
  head restricted to the 1k classes for i21k runs; the reproduction: `test/prec@1`). The y axis
  of every figure.
- the spec's `fewshot_metric` (`fewshot/10shot_avg`: 10-shot linear transfer averaged over the
  datasets; Figure 1, right).
- `core_hours`: cumulative accelerator (or CPU) core hours (the x axis of Figure 1).
- `training_loss`.

Status of a run:

- `missing`: no workdir.
- `finished`: the last logged step is the run's total: config.json's `total_steps`, or its
  `total_epochs` / `total_examples` converted with the trainer's arithmetic
  (`config.get_steps`) when the training split's size is in `recipes.TRAIN_SPLIT_SIZES`. When
  the total is unknown (no config.json, or another dataset): the last record holds a metric of
  every evaluator of config.json's `evals` (the trainer runs all of them at the final step).
  That fallback is a heuristic: it also matches a run that stopped right after a step where
  every evaluator happened to be due.
- `diverged`: the workdir holds a `DIVERGED` file (the study writes it when the trainer stopped
  on a non-finite loss). Its metrics are dropped: it is drawn and tabled like a run without a
  value, and the alpha tables say "diverged".
- `running`: anything else with a workdir, i.e. not finished: still training, preempted and
  not restarted, or stopped by an error (its values are the last logged ones).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
from absl import logging
from etils import epath

from big_vision_relu import config as cfg_lib
from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import recipes
from big_vision_relu.experiments import sweep as sweep_lib

CORE_HOURS = "core_hours"
TRAINING_LOSS = "training_loss"
STATUSES = ("missing", "running", "diverged", "finished")
# Written into a run's workdir by big_vision_relu.experiments.study when its trainer stopped on a
# non-finite loss: the run is a result (this config diverges), not one to retry.
DIVERGED_FILE = "DIVERGED"
_MAX_READERS = 16


def spec_metrics(spec: sweep_lib.FigureSpec) -> tuple[str, ...]:
  """The metrics a report reads: the spec's accuracy and few-shot metrics, core hours, loss."""
  return spec.accuracy_metric, spec.fewshot_metric, CORE_HOURS, TRAINING_LOSS


@dataclasses.dataclass(frozen=True)
class Row:
  """One run of a sweep and its results (`metrics` holds those of `spec_metrics` it logged)."""
  run_id: str
  dataset: str  # the config's stem without 'vit_': 'i21k', 'i1k' or 'mnist_vit'
  args: Mapping[str, Any]  # sweep.Run.args, e.g. variant, attention, alpha, qk_norm, gated
  status: str  # one of STATUSES
  step: int | None = None  # last logged step
  total_steps: int | None = None  # None when unknown
  metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def value(self, metric: str) -> float | None:
    """The last logged value of `metric`, None if never logged (or the run is missing)."""
    return self.metrics.get(metric)


def last_values(records: Mapping[int, Mapping[str, Any]],
                metrics: Sequence[str]) -> dict[str, float]:
  """The value of each metric at the highest step that logged it (metrics never logged are left
  out)."""
  values: dict[str, float] = {}
  for step in sorted(records, reverse=True):
    for metric in metrics:
      if metric not in values and metric in records[step]:
        values[metric] = records[step][metric]
    if len(values) == len(metrics):
      break
  return values


def core_hours(records: Mapping[int, Mapping[str, Any]]) -> float:
  """A run's compute: its `core_hours` at the highest step that logged it; 0 when none did."""
  return float(last_values(records, (CORE_HOURS,)).get(CORE_HOURS, 0.0))


def total_steps(config: Mapping[str, Any] | ml_collections.ConfigDict) -> int | None:
  """A run's total steps as its trainer counts them (`config.get_steps`), from its config:
  config.json's, or the ConfigDict its --config gives (unset fields read as missing, as the
  trainer reads them); None if not computable here (see module doc)."""
  if isinstance(config, ml_collections.ConfigDict):
    config = cfg_lib.without_unset(config).to_dict()
  inputs = config.get("input", {})
  size = recipes.train_split_size(inputs.get("data", {}))
  batch_size = inputs.get("batch_size")
  if not batch_size:
    return None
  try:  # raises for total_epochs of a split not in recipes.TRAIN_SPLIT_SIZES, or no total at all
    return cfg_lib.get_steps(config, "total", total_steps=None, required=True,
                             steps_per_epoch=size / batch_size if size else None,
                             batch_size=batch_size)
  except ValueError:
    return None


def _is_finished(step: int | None, total: int | None, last: Mapping[str, Any],
                 config: Mapping[str, Any]) -> bool:
  if step is None:
    return False
  if total is not None:
    return step >= total
  evals = config.get("evals") or {}
  return bool(evals) and all(any(k.startswith(f"{name}/") for k in last) for name in evals)


def _read_json(path: epath.Path) -> dict[str, Any]:
  try:
    return json.loads(path.read_text())
  except FileNotFoundError:
    return {}
  except json.JSONDecodeError:
    logging.warning("%s: not valid JSON, ignored.", path)
    return {}


def collect_run(run: sweep_lib.Run, workdir: str | epath.Path,
                spec: sweep_lib.FigureSpec = sweep_lib.PAPER_FIGURE) -> Row:
  """The row of one run whose workdir is `workdir`, with the metrics of `spec_metrics(spec)`
  (the default spec suits callers that only need the status)."""
  dataset = epath.Path(run.config).stem.removeprefix("vit_")
  workdir = epath.Path(workdir)
  if not workdir.exists():
    return Row(run.run_id, dataset, dict(run.args), "missing")
  config = _read_json(workdir / "config.json")
  jsonl = workdir / "metrics.jsonl"
  try:
    text = jsonl.read_text()
  except FileNotFoundError:
    text = ""
  records = metrics_lib.parse_metrics(text.splitlines(), name=str(jsonl))
  step = max(records) if records else None
  total = total_steps(config)
  if (workdir / DIVERGED_FILE).exists():  # its last values are no result: none are kept
    return Row(run.run_id, dataset, dict(run.args), "diverged", step=step, total_steps=total)
  finished = _is_finished(step, total, records.get(step, {}), config)
  # The evaluators' run at step 1 measures the initialisation: no result to show for a run.
  results = {s: r for s, r in records.items() if s > 1}
  metrics = {**last_values(records, (CORE_HOURS, TRAINING_LOSS)),
             **last_values(results, spec_metrics(spec))}
  return Row(run.run_id, dataset, dict(run.args), "finished" if finished else "running",
             step=step, total_steps=total,
             metrics={m: metrics[m] for m in spec_metrics(spec) if m in metrics})


def collect_runs(runs: Sequence[sweep_lib.Run], root: str,
                 spec: sweep_lib.FigureSpec) -> list[Row]:
  """One row per run of `runs`, in their order, from `root`."""
  with concurrent.futures.ThreadPoolExecutor(_MAX_READERS) as pool:
    return list(pool.map(lambda r: collect_run(r, sweep_lib.workdir(root, r), spec), runs))


def collect(sweep_path: str, root: str, spec: sweep_lib.FigureSpec) -> list[Row]:
  """One row per run of the sweep file `sweep_path`, in the sweep's order, from `root`."""
  return collect_runs(sweep_lib.load_sweep(sweep_path), root, spec)
