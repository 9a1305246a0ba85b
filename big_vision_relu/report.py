r"""Results of a sweep: a CSV, a Markdown table and its figure, from the runs' workdirs.

    python -m big_vision_relu.report --sweep configs/paper/fig2.py --root gs://BUCKET \
        --out docs/results
    python -m big_vision_relu.report --sweep configs/repro/fig1.py --sweep configs/repro/fig4.py \
        --root results/repro --out docs/reproduction

For each sweep file it writes `<out>/<sweep>.csv`, `<out>/<sweep>.md` and, when the sweep's
name starts with fig1..fig4, `<out>/<sweep>.png`, and prints the paths of the table and the
figure. `--root` and `--out` may be local or gs:// (etils.epath).

What is reported comes from the sweep file's `FIGURE` (`sweep.FigureSpec`, the paper's when it
sets none): the accuracy and few-shot metrics and their labels, the core hours' label, and the
run argument whose values make the columns of Figures 2-4 (`panel_key`, titled with
`panel_title`).

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
- `diverged`: the workdir holds a `DIVERGED` file (big_vision_relu.study writes it when the
  trainer stopped on a non-finite loss). Its metrics are dropped: it is drawn and tabled like a
  run without a value, and the alpha tables say "diverged".
- `running`: anything else with a workdir, i.e. not finished: still training, preempted and
  not restarted, or stopped by an error (its values are the last logged ones).

Seeds. Runs whose dataset and args agree except for `seed` form a group (`group_rows`; without a
`seed` argument each run is its own group). A group's `Stat` of a metric is the mean, the sample
standard deviation (ddof=1; None below 2 values) and the number of its runs that logged the
metric. A group is finished (or missing) when all its runs are, else running. When the runs have
a seed, the Markdown file adds a table of the groups ("Mean ± std over seeds"); the CSV stays
one line per run. For fig2-4 sweeps it adds, per column of the figure, the accuracy as a table
of series (attention and the arguments other than alpha that vary) x alpha, the figure in
numbers. For fig4 sweeps it adds the gate's cost: the core hours of each finished gated
run over those of the same run without the gate (`gate_cost_ratios`), per column value of the
figure and over all pairs.

Figures (matplotlib `Figure` objects, drawn with the Agg canvas; `plot_sweep` returns them) plot
the groups' means, with bars of ± 1 std where a group has 2 values or more:

- fig1: accuracy (left) and few-shot transfer (right) against core hours (log x), one line per
  attention through the model sizes, each point labelled with its `spec.size_key` argument.
- fig2: rows = datasets (the paper: i21k / i1k), columns = values of `panel_key` (the paper:
  S/32 S/16 S/8); accuracy against alpha, one line per activation, softmax as a horizontal
  dashed black line (dotted while not finished; a grey band of ± 1 std).
- fig3 / fig4: the same columns; accuracy against alpha, one line per (activation, qk-LN on/off)
  or (activation, gate on/off): colour = activation, solid = with, dashed = without.

Finished points are filled markers, the others hollow (their last logged values). A point with
no value (runs missing, or no value of that metric logged yet) is marked with an `x` on the x
axis in its line's colour (fig2-4; in fig1 the x position, core hours, is unknown, so the panel
lists them instead), and each panel's title ends with "(N missing)".
"""
from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import io
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from absl import app, flags, logging
from etils import epath
from matplotlib import ticker, transforms
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from big_vision_relu import config as cfg_lib
from big_vision_relu import metrics as metrics_lib
from big_vision_relu import recipes
from big_vision_relu import sweep as sweep_lib

CORE_HOURS = "core_hours"
TRAINING_LOSS = "training_loss"
SEED = "seed"
GATED = "gated"
STATUSES = ("missing", "running", "diverged", "finished")
# Written into a run's workdir by big_vision_relu.study when its trainer stopped on a
# non-finite loss: the run is a result (this config diverges), not one to retry.
DIVERGED_FILE = "DIVERGED"
_MARKDOWN_HEADERS = {"i1k/prec@1": "i1k acc", "test/prec@1": "test acc",
                     "fewshot/10shot_avg": "10-shot avg", CORE_HOURS: "core hours",
                     TRAINING_LOSS: "train loss"}
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


def total_steps(config: Mapping[str, Any]) -> int | None:
  """A run's total steps from its config.json, None if not computable here (see module doc)."""
  if config.get("total_steps") is not None:
    return int(config["total_steps"])
  data = config.get("input", {}).get("data", {})
  size = recipes.TRAIN_SPLIT_SIZES.get((data.get("name"), data.get("split")))
  batch_size = config.get("input", {}).get("batch_size")
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
  metrics = {**last_values(records, ("core_hours", "training_loss")),
             **last_values(results, spec_metrics(spec))}
  return Row(run.run_id, dataset, dict(run.args), "finished" if finished else "running",
             step=step, total_steps=total,
             metrics={m: metrics[m] for m in spec_metrics(spec) if m in metrics})


def collect(sweep_path: str, root: str, spec: sweep_lib.FigureSpec) -> list[Row]:
  """One row per run of the sweep file `sweep_path`, in the sweep's order, from `root`."""
  runs = sweep_lib.load_sweep(sweep_path)
  with concurrent.futures.ThreadPoolExecutor(_MAX_READERS) as pool:
    return list(pool.map(lambda r: collect_run(r, sweep_lib.workdir(root, r), spec),
                         runs))


# ------------------------------------------------------------------------------------- seeds


@dataclasses.dataclass(frozen=True)
class Stat:
  """A metric over runs: mean, sample standard deviation (ddof=1; None for n < 2), count."""
  mean: float
  std: float | None
  n: int


def summarize(values: Sequence[float]) -> Stat | None:
  """The Stat of `values`, None when there are none."""
  if not values:
    return None
  return Stat(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None,
              len(values))


@dataclasses.dataclass(frozen=True)
class Group:
  """The runs whose dataset and args agree except for the seed (`args` leaves it out)."""
  dataset: str
  args: Mapping[str, Any]
  rows: tuple[Row, ...]

  @property
  def status(self) -> str:
    """'finished' or 'missing' when all its runs are, else 'running'."""
    statuses = {r.status for r in self.rows}
    return statuses.pop() if len(statuses) == 1 else "running"

  def values(self, metric: str) -> list[float]:
    """`metric` of each run that logged it."""
    return [v for r in self.rows if (v := r.value(metric)) is not None]

  def stat(self, metric: str) -> Stat | None:
    """The Stat of `metric` over the runs that logged it, None if none did."""
    return summarize(self.values(metric))

  def value(self, metric: str) -> float | None:
    """The mean of `metric` over the runs that logged it, None if none did."""
    stat = self.stat(metric)
    return None if stat is None else stat.mean


_Key = tuple[str, tuple[tuple[str, Any], ...]]


def _key_without(row: Row, arg: str) -> _Key:
  """The row's dataset and args but `arg`: rows with equal keys differ at most in `arg`."""
  return row.dataset, tuple((k, v) for k, v in row.args.items() if k != arg)


def group_rows(rows: Sequence[Row]) -> list[Group]:
  """The groups of runs that differ only in `seed`, in order of first appearance (one run each
  when the runs have no seed)."""
  groups: dict[_Key, list[Row]] = {}
  for row in rows:
    groups.setdefault(_key_without(row, SEED), []).append(row)
  return [Group(dataset, dict(args), tuple(members))
          for (dataset, args), members in groups.items()]


def _has_seeds(rows: Sequence[Row]) -> bool:
  return any(SEED in r.args for r in rows)


def gate_cost_ratios(rows: Sequence[Row]) -> list[tuple[Row, float]]:
  """(gated run, its core hours / those of the same run without the gate) for each pair of
  finished runs (with core hours) that differ only in `gated`, in the order of the gated runs."""
  done = [r for r in rows if r.status == "finished" and (r.value(CORE_HOURS) or 0) > 0]
  ungated = {_key_without(r, GATED): r for r in done if not r.args[GATED]}
  ratios = []
  for row in done:
    match = ungated.get(_key_without(row, GATED))
    if row.args[GATED] and match is not None:
      ratios.append((row, row.value(CORE_HOURS) / match.value(CORE_HOURS)))
  return ratios


# ------------------------------------------------------------------------------------ tables


def _arg_keys(items: Sequence[Row | Group]) -> list[str]:
  keys: dict[str, None] = {}
  for item in items:
    keys.update(dict.fromkeys(item.args))
  return list(keys)


def _cell(value: Any) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    return repr(value)
  return str(value)


def to_csv(rows: Sequence[Row], spec: sweep_lib.FigureSpec) -> str:
  """CSV: run_id, dataset, the args, status, step, total_steps, `spec_metrics(spec)` (exact
  values; empty when unknown, never logged or missing)."""
  keys = _arg_keys(rows)
  metrics = spec_metrics(spec)
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(["run_id", "dataset", *keys, "status", "step", "total_steps", *metrics])
  for row in rows:
    writer.writerow([row.run_id, row.dataset, *(_cell(row.args.get(k)) for k in keys),
                     row.status, _cell(row.step), _cell(row.total_steps),
                     *(_cell(row.value(m)) for m in metrics)])
  return out.getvalue()


def _decimals(metric: str | None, value: float) -> int:
  """4; for core hours 1, or more below 1 core hour so that 2 significant digits show."""
  if metric != CORE_HOURS:
    return 4
  return 1 if value >= 1 or value <= 0 else 1 - math.floor(math.log10(value))


def _markdown_value(metric: str, value: float | None) -> str:
  return "-" if value is None else f"{value:.{_decimals(metric, value)}f}"


def _stat_cell(stat: Stat | None, metric: str | None = None) -> str:
  """'mean ± std (n)', 'mean (1)', or '-' without values; as many decimals as a run's value."""
  if stat is None:
    return "-"
  decimals = _decimals(metric, stat.mean)
  spread = "" if stat.std is None else f" ± {stat.std:.{decimals}f}"
  return f"{stat.mean:.{decimals}f}{spread} ({stat.n})"


def _markdown_arg(value: Any) -> str:
  return f"{value:g}" if isinstance(value, float) else str(value)


def _table_lines(header: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
  """A Markdown table: the header, its rule, a line per cells of `body`."""
  return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
          *("| " + " | ".join(cells) + " |" for cells in body)]


def to_markdown(rows: Sequence[Row], spec: sweep_lib.FigureSpec, title: str = "", *,
                alpha_tables: bool = False, gate_cost: bool = False) -> str:
  """A Markdown table of the runs with a summary line: accuracies and losses to 4 decimals, '-'
  where no value was logged, step 'n/total' (or 'n' when the total is unknown). Then, when the
  runs have a seed, the groups' mean ± std over seeds, and with `gate_cost` (fig4) the gate's
  cost in core hours."""
  keys = _arg_keys(rows)
  metrics = spec_metrics(spec)
  counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
  lines = [f"# {title}", ""] if title else []
  diverged = f"{counts['diverged']} diverged, " if counts["diverged"] else ""
  lines += [(f"{len(rows)} runs: {counts['finished']} finished, {counts['running']} running, "
             f"{diverged}{counts['missing']} missing. Values are the last logged ones."), ""]
  header = ["run", "dataset", *keys, "status", "step", *(_MARKDOWN_HEADERS.get(m, m)
                                                          for m in metrics)]
  cells = []
  for row in rows:
    if row.step is None:
      step = "-"
    else:
      step = f"{row.step}/{row.total_steps}" if row.total_steps else str(row.step)
    cells.append([row.run_id, row.dataset, *(_markdown_arg(row.args.get(k, "")) for k in keys),
                  row.status, step, *(_markdown_value(m, row.value(m)) for m in metrics)])
  lines += _table_lines(header, cells)
  if _has_seeds(rows):
    lines += _seeds_markdown(rows, metrics)
  if alpha_tables:
    lines += _alpha_markdown(rows, spec)
  if gate_cost:
    lines += _gate_cost_markdown(rows, spec.panel_key)
  return "\n".join(lines) + "\n"


def _finished_cell(group: Group, metric: str) -> str:
  """The finished runs' Stat; 'diverged' when none finished and one diverged."""
  stat = summarize([v for r in group.rows
                    if r.status == "finished" and (v := r.value(metric)) is not None])
  if stat is None and any(r.status == "diverged" for r in group.rows):
    return "diverged"
  return _stat_cell(stat, metric)


def _alpha_markdown(rows: Sequence[Row], spec: sweep_lib.FigureSpec) -> list[str]:
  """Per dataset and column of the figure: accuracy, series (attention + the other varying
  args) x alpha. Softmax takes no alpha: its value is in its run's alpha column only."""
  groups = group_rows(rows)
  alphas = sorted({g.args["alpha"] for g in groups})
  lines = ["", f"## {spec.accuracy_label} by alpha", "",
           "Finished runs only: mean ± sample std over seeds (how many); '-': none finished."]
  for dataset in _ordered(g.dataset for g in groups):
    for panel in _panel_values([g for g in groups if g.dataset == dataset], spec.panel_key):
      panel_groups = [g for g in groups
                      if g.dataset == dataset and g.args[spec.panel_key] == panel]
      varying = [k for k in _arg_keys(panel_groups) if k not in ("alpha", spec.panel_key)
                 and len({_markdown_arg(g.args[k]) for g in panel_groups}) > 1]
      series: dict[tuple[str, ...], dict[float, Group]] = {}
      for group in panel_groups:
        label = tuple(f"{k}={_markdown_arg(group.args[k])}" if k != "attention"
                      else group.args[k] for k in varying)
        series.setdefault(label, {})[group.args["alpha"]] = group
      cells = [[", ".join(label), *(_finished_cell(by_alpha[a], spec.accuracy_metric)
                                    if a in by_alpha else "" for a in alphas)]
               for label, by_alpha in series.items()]
      title = spec.panel_title.format(dataset=dataset, value=panel)
      lines += ["", f"### {title}", "",
                *_table_lines([", ".join(varying), *(f"alpha {_markdown_arg(a)}"
                                                     for a in alphas)], cells)]
  return lines


def _seeds_markdown(rows: Sequence[Row], metrics: Sequence[str]) -> list[str]:
  """The table of the groups of runs that differ only in the seed."""
  groups = group_rows(rows)
  keys = _arg_keys(groups)
  header = ["dataset", *keys, "status", "seeds", *(_MARKDOWN_HEADERS.get(m, m) for m in metrics)]
  cells = [[group.dataset, *(_markdown_arg(group.args.get(k, "")) for k in keys), group.status,
            str(len(group.rows)), *(_stat_cell(group.stat(m), m) for m in metrics)]
           for group in groups]
  return ["", "## Mean ± std over seeds", "",
          (f"{len(groups)} groups of runs that differ only in the seed. A cell is the mean ± "
           "sample std (ddof=1) over the group's runs that logged the metric (how many); a group "
           "is finished when all its runs are."), "", *_table_lines(header, cells)]


def _gate_cost_markdown(rows: Sequence[Row], panel_key: str) -> list[str]:
  """The core hours of the gated runs over those without the gate, per value of `panel_key`."""
  ratios = gate_cost_ratios(rows)
  cells = [[_markdown_arg(value),
            _stat_cell(summarize([q for r, q in ratios if r.args[panel_key] == value]))]
           for value in _panel_values(rows, panel_key)]
  cells.append(["all", _stat_cell(summarize([q for _, q in ratios]))])
  return ["", "## Gate cost: core hours with gate / without gate", "",
          ("Over the pairs of finished runs identical but for the gate: mean ± sample std "
           "(number of pairs)."), "",
          *_table_lines([panel_key, "with / without gate"], cells)]


# ----------------------------------------------------------------------------------- figures

_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
_NOTE = "filled marker: finished, hollow marker: running (last logged value); "
_NOTE_SEEDS = "points: mean over seeds (filled once all finished), bars: ± 1 std"
_NOTE_X = "x on the x axis: no value (run missing or not evaluated yet)"
_NOTE_LIST = "runs without a value are listed in the panel"
_ALPHA_LABEL = r"$\alpha$  (weights $L^{-\alpha}\,h(q\cdot k/\sqrt{d})$)"
VARIANTS_ALPHA = ("S/32", "S/16", "S/8")

# (x, the Stat of the plotted metric, the group).
_Point = tuple[float, Stat, Group]


def _new_figure(width: float, height: float) -> Figure:
  figure = Figure(figsize=(width, height), layout="constrained")
  FigureCanvasAgg(figure)
  return figure


def _label(attention: str) -> str:
  """Figure 1's legend: the paper's name for relu attention with alpha = 1."""
  return "relu/seqlen" if attention == "relu" else attention


def _ordered(values: Iterable[Any]) -> list[Any]:
  return list(dict.fromkeys(values))


def _panel_values(items: Iterable[Row | Group], key: str) -> list[Any]:
  """The values of the args' `key`: the paper's S/32, S/16, S/8 first, the others in order of
  appearance."""
  present = _ordered(item.args[key] for item in items)
  return [v for v in VARIANTS_ALPHA if v in present] + [v for v in present
                                                         if v not in VARIANTS_ALPHA]


def _missing_title(title: str, missing: int) -> str:
  return f"{title} ({missing} missing)" if missing else title


def _draw_points(ax: Axes, points: Sequence[_Point], *, color: str, linestyle: str = "-",
                 label: str | None = None) -> None:
  """A line through the means with filled markers at finished groups, hollow ones at the
  others, and bars of ± 1 std where a group has several values."""
  xs = [x for x, _, _ in points]
  ys = [stat.mean for _, stat, _ in points]
  finished = [group.status == "finished" for _, _, group in points]
  ax.plot(xs, ys, color=color, linestyle=linestyle, marker="o", markersize=5,
          markevery=finished if points else None, label=label)
  spread = [(x, stat) for x, stat, _ in points if stat.std is not None]
  if spread:
    ax.vlines([x for x, _ in spread], [s.mean - s.std for _, s in spread],
              [s.mean + s.std for _, s in spread], colors=color, linewidth=1, gid="std")
  running = [(x, stat) for x, stat, group in points if group.status != "finished"]
  if running:
    ax.scatter([x for x, _ in running], [s.mean for _, s in running], s=30,
               facecolors="white", edgecolors=color, linewidths=1.3, zorder=3, gid="running")


def _mark_missing_x(ax: Axes, xs: Sequence[float], color: str) -> None:
  """Crosses on the x axis (data x, axes y = 0) at the points with no value; where several
  series miss the same x the last one drawn shows (the title has the count)."""
  if xs:
    ax.scatter(xs, [0.0] * len(xs), marker="x", s=30, color=color, clip_on=False, zorder=4,
               transform=transforms.blended_transform_factory(ax.transData, ax.transAxes),
               gid="missing")


def _percent_axis(ax: Axes) -> None:
  # decimals=None: as many as the axis range needs (a narrow range gets 89.5%, 90.0%, ...).
  ax.yaxis.set_major_formatter(ticker.PercentFormatter(xmax=1.0, decimals=None))
  ax.grid(True, alpha=0.3)


def _finish_figure(figure: Figure, title: str, handles_from: Axes, ncol: int, *, seeds: bool,
                   note: str = _NOTE_X) -> None:
  """Suptitle, and a legend below the panels headed by the marker conventions (and the seeds'
  when the runs have a seed), one line each so that they fit the figure's width."""
  handles, labels = handles_from.get_legend_handles_labels()
  conventions = [_NOTE + note] + ([_NOTE_SEEDS] if seeds else [])
  legend = figure.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False,
                         title="\n".join(conventions), title_fontsize=7)
  legend.get_title().set_color("0.35")
  figure.suptitle(title)


def plot_fig1(rows: Sequence[Row], spec: sweep_lib.FigureSpec, title: str = "fig1") -> Figure:
  """Figure 1: accuracy (left) and few-shot transfer (right) against core hours (log x), one
  line per attention through the model sizes (points labelled with their variant, or size)."""
  groups = group_rows(rows)
  figure = _new_figure(11, 4.8)
  axes = figure.subplots(1, 2)
  attentions = _ordered(g.args["attention"] for g in groups)
  panels = ((spec.accuracy_metric, spec.accuracy_label),
            (spec.fewshot_metric, spec.fewshot_label))
  for ax, (metric, ylabel) in zip(axes, panels, strict=True):
    missing = []
    for i, attention in enumerate(attentions):
      points = []
      for group in groups:
        if group.args["attention"] != attention:
          continue
        x, stat = group.value(CORE_HOURS), group.stat(metric)
        if x is None or stat is None or x <= 0:
          missing.append((attention, str(group.args[spec.size_key])))
        else:
          points.append((x, stat, group))
      points.sort(key=lambda p: p[0])
      color = _COLORS[i % len(_COLORS)]
      _draw_points(ax, points, color=color, label=_label(attention))
      for x, stat, group in points:
        ax.annotate(str(group.args[spec.size_key]), (x, stat.mean), textcoords="offset points",
                    xytext=(4, -10), fontsize=7, color=color)
    if missing:
      note = ax.text(0.98, 0.02, "no value:\n" + "\n".join(
          f"{_label(a)}: " + ", ".join(v for b, v in missing if b == a)
          for a in _ordered(a for a, _ in missing)), transform=ax.transAxes, ha="right",
                     va="bottom", fontsize=7, color="0.3", gid="missing", zorder=1.5,
                     bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.7})
      note.set_in_layout(False)
    ax.set_xscale("log")
    ax.margins(x=0.1, y=0.08)
    ax.xaxis.set_major_formatter(ticker.LogFormatter())
    ax.xaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False,
                                                     minor_thresholds=(2, 0.5)))
    ax.set_xlabel(spec.core_hours_label)
    ax.set_ylabel(ylabel)
    ax.set_title(_missing_title(ylabel, len(missing)), fontsize=10)
    _percent_axis(ax)
  _finish_figure(figure, title, axes[0], ncol=len(attentions), seeds=_has_seeds(rows),
                 note=_NOTE_LIST)
  return figure


def _alpha_panel(ax: Axes, groups: Sequence[Group], metric: str,
                 series: Sequence[tuple[str, Callable[[Group], bool], str, str]]) -> int:
  """`metric` against alpha: one line per (label, predicate, color, linestyle) of `series`
  (drawn even when empty, so every panel has the same lines). Returns the number of points
  without a value."""
  missing = 0
  for label, selects, color, linestyle in series:
    selected = sorted((g for g in groups if selects(g)), key=lambda g: g.args["alpha"])
    points = [(g.args["alpha"], stat, g) for g in selected
              if (stat := g.stat(metric)) is not None]
    absent = [g.args["alpha"] for g in selected if g.stat(metric) is None]
    _draw_points(ax, points, color=color, linestyle=linestyle, label=label)
    _mark_missing_x(ax, absent, color)
    missing += len(absent)
  ax.set_xlim(-0.08, 2.08)
  _percent_axis(ax)
  return missing


def plot_fig2(rows: Sequence[Row], spec: sweep_lib.FigureSpec, title: str = "fig2") -> Figure:
  """Figure 2: rows = datasets, columns = values of the spec's panel_key; accuracy against
  alpha, one line per activation, softmax as a horizontal dashed line (dotted while not
  finished) in a band of ± 1 std."""
  groups = group_rows(rows)
  datasets = [d for d in ("i21k", "i1k") if any(g.dataset == d for g in groups)]
  datasets += _ordered(g.dataset for g in groups if g.dataset not in datasets)
  values = _panel_values(groups, spec.panel_key)
  activations = _ordered(g.args["attention"] for g in groups if g.args["attention"] != "softmax")
  figure = _new_figure(4.3 * len(values), 3.6 * len(datasets) + 0.9)
  axes = figure.subplots(len(datasets), len(values), sharey="row", squeeze=False)
  row_names = {"i21k": "ImageNet-21k, 30 ep", "i1k": "ImageNet-1k, 300 ep"}
  series = [(a, lambda g, a=a: g.args["attention"] == a, _COLORS[k % len(_COLORS)], "-")
            for k, a in enumerate(activations)]
  for i, dataset in enumerate(datasets):
    for j, value in enumerate(values):
      ax = axes[i][j]
      panel = [g for g in groups if g.dataset == dataset and g.args[spec.panel_key] == value]
      missing = _alpha_panel(ax, panel, spec.accuracy_metric, series)
      for softmax in (g for g in panel if g.args["attention"] == "softmax"):
        stat = softmax.stat(spec.accuracy_metric)
        if stat is None:
          missing += 1
          continue
        ax.axhline(stat.mean, color="black", linewidth=1.2, label="softmax",
                   linestyle="--" if softmax.status == "finished" else ":")
        if stat.std is not None:
          ax.axhspan(stat.mean - stat.std, stat.mean + stat.std, color="black", alpha=0.1,
                     linewidth=0, gid="std")
      ax.set_title(_missing_title(spec.panel_title.format(dataset=dataset, value=value),
                                  missing), fontsize=10)
      if i == len(datasets) - 1:
        ax.set_xlabel(_ALPHA_LABEL)
      if j == 0:
        named = dataset in row_names or len(datasets) > 1
        ax.set_ylabel(spec.accuracy_label
                      + (f"\n({row_names.get(dataset, dataset)})" if named else ""))
  handles_from = max(axes.flat, key=lambda a: len(a.get_legend_handles_labels()[1]))
  _finish_figure(figure, title, handles_from, ncol=len(activations) + 1, seeds=_has_seeds(rows))
  return figure


def _plot_ablation(rows: Sequence[Row], spec: sweep_lib.FigureSpec, title: str, flag: str,
                   on: str, off: str) -> Figure:
  """Figures 3 and 4: columns = values of the spec's panel_key; accuracy against alpha, one
  line per activation x `flag` (colour = activation, solid = flag on, dashed = off)."""
  groups = group_rows(rows)
  values = _panel_values(groups, spec.panel_key)
  activations = _ordered(g.args["attention"] for g in groups)
  figure = _new_figure(4.3 * len(values), 4.5)
  axes = figure.subplots(1, len(values), sharey=True, squeeze=False)[0]
  series = [(f"{a}, {on if value else off}",
             lambda g, a=a, value=value: g.args["attention"] == a and g.args[flag] == value,
             _COLORS[k % len(_COLORS)], "-" if value else "--")
            for k, a in enumerate(activations) for value in (True, False)]
  dataset = groups[0].dataset if groups else ""
  for j, value in enumerate(values):
    ax = axes[j]
    missing = _alpha_panel(ax, [g for g in groups if g.args[spec.panel_key] == value],
                           spec.accuracy_metric, series)
    ax.set_title(_missing_title(spec.panel_title.format(dataset=dataset, value=value), missing),
                 fontsize=10)
    ax.set_xlabel(_ALPHA_LABEL)
    if j == 0:
      ax.set_ylabel(spec.accuracy_label)
  _finish_figure(figure, title, axes[0], ncol=len(series), seeds=_has_seeds(rows))
  return figure


def plot_fig3(rows: Sequence[Row], spec: sweep_lib.FigureSpec, title: str = "fig3") -> Figure:
  """Figure 3: with / without qk-layernorm (solid / dashed) for each activation."""
  return _plot_ablation(rows, spec, title, "qk_norm", "qk-LN", "no qk-LN")


def plot_fig4(rows: Sequence[Row], spec: sweep_lib.FigureSpec, title: str = "fig4") -> Figure:
  """Figure 4: with / without the attention gate (solid / dashed) for each activation."""
  return _plot_ablation(rows, spec, title, GATED, "gate", "no gate")


PLOTS: dict[str, Callable[[Sequence[Row], sweep_lib.FigureSpec, str], Figure]] = {
    "fig1": plot_fig1, "fig2": plot_fig2, "fig3": plot_fig3, "fig4": plot_fig4}


def figure_kind(name: str) -> str | None:
  """'fig1'..'fig4' for a sweep named fig1..fig4 (or e.g. 'fig2_small'), else None."""
  match = re.match(r"(fig[1-4])(?![0-9])", name)
  return match.group(1) if match else None


def plot_sweep(name: str, rows: Sequence[Row], spec: sweep_lib.FigureSpec) -> Figure | None:
  """The figure of the sweep called `name` (by its figure number), None for other sweeps (or
  no rows)."""
  kind = figure_kind(name)
  return PLOTS[kind](rows, spec, name) if kind and rows else None


# --------------------------------------------------------------------------------------- CLI


def write_report(sweep_path: str, root: str, out: str) -> dict[str, str]:
  """Collects a sweep (with its file's FigureSpec) and writes <out>/<sweep>.csv, .md and
  (fig1..fig4) .png.

  Returns {'csv': path, 'md': path, 'png': path (only when a figure was drawn)}.
  """
  name = sweep_lib.sweep_name(sweep_path)
  spec = sweep_lib.load_figure_spec(sweep_path)
  rows = collect(sweep_path, root, spec)
  out_dir = epath.Path(out)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {"csv": out_dir / f"{name}.csv", "md": out_dir / f"{name}.md"}
  paths["csv"].write_text(to_csv(rows, spec))
  paths["md"].write_text(to_markdown(rows, spec, title=f"{name} ({root})",
                                     alpha_tables=figure_kind(name) in ("fig2", "fig3",
                                                                        "fig4"),
                                     gate_cost=figure_kind(name) == "fig4"))
  figure = plot_sweep(name, rows, spec)
  if figure is not None:
    paths["png"] = out_dir / f"{name}.png"
    with paths["png"].open("wb") as f:
      figure.savefig(f, format="png", dpi=130)
  return {k: str(v) for k, v in paths.items()}


def report_sweeps(sweep_paths: Sequence[str], root: str, out_dir: str) -> None:
  """`write_report` for each sweep; prints the paths of its table and figure."""
  for sweep_path in sweep_paths:
    paths = write_report(sweep_path, root, out_dir)
    print(paths["md"])
    print(paths.get("png", f"(no figure for {sweep_lib.sweep_name(sweep_path)}: not fig1..fig4)"))
    sys.stdout.flush()


def main(argv: Sequence[str]) -> None:
  """`python -m big_vision_relu.report --sweep FILE [--sweep FILE ...] --root DIR --out DIR`:
  tables (CSV, Markdown) and the figure of sweeps, from their runs' metrics.jsonl under
  ROOT/runs/<run id>."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}; pass --sweep, --root and --out.")
  report_sweeps(FLAGS.sweep, FLAGS.root, FLAGS.out)


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_multi_string("sweep", None, "A sweep file (configs/paper/fig2.py); repeatable.",
                            required=True)
  flags.DEFINE_string("root", None, "The workdir root (local or gs://).", required=True)
  flags.DEFINE_string("out", "docs/results", "Output directory (local or gs://).")
  app.run(main)
