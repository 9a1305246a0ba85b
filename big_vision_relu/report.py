r"""Results of a sweep: a CSV, a Markdown table and the paper's figure, from the runs' workdirs.

    python -m big_vision_relu.report --sweep configs/paper/fig2.py --root gs://BUCKET/runs \
        --out docs/results
    python -m big_vision_relu.report --sweep configs/paper/fig1.py --sweep configs/paper/fig3.py \
        --root /tmp/runs --out /tmp/results

For each sweep file it writes `<out>/<sweep>.csv`, `<out>/<sweep>.md` and, when the sweep's
name starts with fig1..fig4, `<out>/<sweep>.png`, and prints the paths of the table and the
figure. `--root` and `--out` may be local or gs:// (etils.epath).

What is read. A run's workdir is `<root>/<sweep name>/<run id>` (`sweep.workdir`). From it:

- `metrics.jsonl`, one JSON object per logged step (`big_vision_relu.metrics`). Lines are
  replayed in file order: a line for step s first drops every record of a step > s (those were
  logged by a run that was preempted and later resumed from an earlier checkpoint: the resumed
  run supersedes them), then updates record s key by key, so when a step appears twice the
  later line wins. Unparseable lines (e.g. a half-written last line) are skipped with a warning.
- `config.json` (the trainer writes it): for the run's total number of steps.

For each metric of `METRICS` a row holds its LAST logged value: the value at the highest step
that logged it (evaluators log less often than the training loss, so these steps may differ).

- `i1k/prec@1`: ImageNet-1k top-1 accuracy (i21k runs: the 21k head restricted to the 1k
  classes; i1k runs: the validation split). The y axis of every figure.
- `fewshot/10shot_avg`: 10-shot linear transfer averaged over the 8 datasets (Figure 1, right).
- `core_hours`: cumulative accelerator core hours (the x axis of Figure 1).
- `training_loss`.

Status of a run:

- `missing`: no workdir.
- `finished`: the last logged step is the run's total: config.json's `total_steps`, or its
  `total_epochs` / `total_examples` converted with the trainer's arithmetic
  (`config.get_steps`) when the training split's size is in `recipes.TRAIN_SPLIT_SIZES` (the paper's
  two training splits). When the total is unknown (no config.json, or another dataset): the
  last record holds a metric of every evaluator of config.json's `evals` (the trainer runs all
  of them at the final step). That fallback is a heuristic: it also matches a run that stopped
  right after a step where every evaluator happened to be due.
- `running`: anything else with a workdir, i.e. not finished: still training, preempted and
  not restarted, or stopped by an error (its values are the last logged ones).

Figures (matplotlib `Figure` objects, drawn with the Agg canvas; `plot_sweep` returns them):

- fig1: ImageNet-1k accuracy (left) and 10-shot average (right) against core hours (log x),
  one line per attention through the model sizes, each point labelled with its variant.
- fig2: rows i21k / i1k, columns S/32 S/16 S/8; accuracy against alpha, one line per
  activation, softmax as a horizontal dashed black line (dotted while that run is running).
- fig3 / fig4: columns S/32 S/16 S/8; accuracy against alpha, one line per (activation, qk-LN
  on/off) or (activation, gate on/off): colour = activation, solid = with, dashed = without.

Finished points are filled markers, running ones hollow (their last logged value). A point
with no value (run missing, or no value of that metric logged yet) is marked with an `x` on the
x axis in its line's colour (fig2-4; in fig1 the x position, core hours, is unknown, so the
panel lists them instead), and each panel's title ends with "(N missing)".
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import io
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from absl import logging
from etils import epath
from matplotlib import ticker, transforms
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from big_vision_relu import config as cfg_lib
from big_vision_relu import recipes
from big_vision_relu import sweep as sweep_lib

METRICS = ("i1k/prec@1", "fewshot/10shot_avg", "core_hours", "training_loss")
ACCURACY = "i1k/prec@1"
FEWSHOT = "fewshot/10shot_avg"
CORE_HOURS = "core_hours"
STATUSES = ("missing", "running", "finished")
_MARKDOWN_HEADERS = {ACCURACY: "i1k acc", FEWSHOT: "10-shot avg", CORE_HOURS: "core hours",
                     "training_loss": "train loss"}
_MAX_READERS = 16


@dataclasses.dataclass(frozen=True)
class Row:
  """One run of a sweep and its results (`metrics` holds the metrics of METRICS it logged)."""
  run_id: str
  dataset: str  # the config's stem without 'vit_': 'i21k' or 'i1k'
  args: Mapping[str, Any]  # sweep.Run.args: variant, attention, alpha, qk_norm, gated
  status: str  # one of STATUSES
  step: int | None = None  # last logged step
  total_steps: int | None = None  # None when unknown
  metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def value(self, metric: str) -> float | None:
    """The last logged value of `metric`, None if never logged (or the run is missing)."""
    return self.metrics.get(metric)


def parse_metrics(lines: Iterable[str], name: str = "metrics.jsonl") -> dict[int, dict[str, Any]]:
  """{step: {metric: value}} from metrics.jsonl lines, in increasing step order.

  A line for step s drops the records of steps > s (a resumed run superseded them) and then
  updates record s, so a step's later line wins. Unparseable lines are skipped with a warning.
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
  return records


def last_values(records: Mapping[int, Mapping[str, Any]],
                metrics: Sequence[str] = METRICS) -> dict[str, float]:
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


def collect_run(run: sweep_lib.Run, workdir: str | epath.Path) -> Row:
  """The row of one run whose workdir is `workdir`."""
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
  records = parse_metrics(text.splitlines(), name=str(jsonl))
  step = max(records) if records else None
  total = total_steps(config)
  finished = _is_finished(step, total, records.get(step, {}), config)
  return Row(run.run_id, dataset, dict(run.args), "finished" if finished else "running",
             step=step, total_steps=total, metrics=last_values(records))


def collect(sweep_path: str, root: str) -> list[Row]:
  """One row per run of the sweep file `sweep_path`, in the sweep's order, from `root`."""
  runs = sweep_lib.load_sweep(sweep_path)
  with concurrent.futures.ThreadPoolExecutor(_MAX_READERS) as pool:
    return list(pool.map(lambda r: collect_run(r, sweep_lib.workdir(root, sweep_path, r)),
                         runs))


# ------------------------------------------------------------------------------------ tables


def _arg_keys(rows: Sequence[Row]) -> list[str]:
  keys: dict[str, None] = {}
  for row in rows:
    keys.update(dict.fromkeys(row.args))
  return list(keys)


def _cell(value: Any) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    return repr(value)
  return str(value)


def to_csv(rows: Sequence[Row]) -> str:
  """CSV: run_id, dataset, the args, status, step, total_steps, METRICS (exact values; empty
  when unknown, never logged or missing)."""
  keys = _arg_keys(rows)
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(["run_id", "dataset", *keys, "status", "step", "total_steps", *METRICS])
  for row in rows:
    writer.writerow([row.run_id, row.dataset, *(_cell(row.args.get(k)) for k in keys),
                     row.status, _cell(row.step), _cell(row.total_steps),
                     *(_cell(row.value(m)) for m in METRICS)])
  return out.getvalue()


def _markdown_value(metric: str, value: float | None) -> str:
  if value is None:
    return "-"
  if metric == CORE_HOURS:
    return f"{value:.1f}"
  return f"{value:.4f}"


def _markdown_arg(value: Any) -> str:
  return f"{value:g}" if isinstance(value, float) else str(value)


def to_markdown(rows: Sequence[Row], title: str = "") -> str:
  """A Markdown table with a summary line; accuracies and losses to 4 decimals, '-' where no
  value was logged, step 'n/total' (or 'n' when the total is unknown)."""
  keys = _arg_keys(rows)
  counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
  lines = [f"# {title}", ""] if title else []
  lines += [(f"{len(rows)} runs: {counts['finished']} finished, {counts['running']} running, "
             f"{counts['missing']} missing. Values are the last logged ones."), ""]
  header = ["run", "dataset", *keys, "status", "step", *(_MARKDOWN_HEADERS.get(m, m)
                                                          for m in METRICS)]
  lines.append("| " + " | ".join(header) + " |")
  lines.append("|" + "---|" * len(header))
  for row in rows:
    if row.step is None:
      step = "-"
    else:
      step = f"{row.step}/{row.total_steps}" if row.total_steps else str(row.step)
    cells = [row.run_id, row.dataset, *(_markdown_arg(row.args.get(k, "")) for k in keys),
             row.status, step, *(_markdown_value(m, row.value(m)) for m in METRICS)]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------- figures

_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
_NOTE = "filled marker: finished   hollow marker: running (last logged value)   "
_NOTE_X = "x on the x axis: no value (run missing or not evaluated yet)"
_NOTE_LIST = "runs without a value are listed in the panel"
VARIANTS_ALPHA = ("S/32", "S/16", "S/8")


def _new_figure(width: float, height: float) -> Figure:
  figure = Figure(figsize=(width, height), layout="constrained")
  FigureCanvasAgg(figure)
  return figure


def _label(attention: str) -> str:
  """Figure 1's legend: the paper's name for relu attention with alpha = 1."""
  return "relu/seqlen" if attention == "relu" else attention


def _ordered(values: Iterable[Any]) -> list[Any]:
  return list(dict.fromkeys(values))


def _missing_title(title: str, missing: int) -> str:
  return f"{title} ({missing} missing)" if missing else title


def _draw_points(ax: Axes, points: Sequence[tuple[float, float, Row]], *, color: str,
                 linestyle: str = "-", label: str | None = None) -> None:
  """A line through (x, y) with filled markers at finished runs and hollow ones at running."""
  xs = [p[0] for p in points]
  ys = [p[1] for p in points]
  finished = [p[2].status == "finished" for p in points]
  ax.plot(xs, ys, color=color, linestyle=linestyle, marker="o", markersize=5,
          markevery=finished if points else None, label=label)
  running = [p for p in points if p[2].status != "finished"]
  if running:
    ax.scatter([p[0] for p in running], [p[1] for p in running], s=30, facecolors="white",
               edgecolors=color, linewidths=1.3, zorder=3, gid="running")


def _mark_missing_x(ax: Axes, xs: Sequence[float], color: str) -> None:
  """Crosses on the x axis (data x, axes y = 0) at the runs with no value; where several
  series miss the same x the last one drawn shows (the title has the count)."""
  if xs:
    ax.scatter(xs, [0.0] * len(xs), marker="x", s=30, color=color, clip_on=False, zorder=4,
               transform=transforms.blended_transform_factory(ax.transData, ax.transAxes),
               gid="missing")


def _percent_axis(ax: Axes) -> None:
  ax.yaxis.set_major_formatter(ticker.PercentFormatter(xmax=1.0, decimals=0))
  ax.grid(True, alpha=0.3)


def _finish_figure(figure: Figure, title: str, handles_from: Axes, ncol: int,
                   note: str = _NOTE_X) -> None:
  """Suptitle, and a legend below the panels headed by the marker conventions."""
  handles, labels = handles_from.get_legend_handles_labels()
  legend = figure.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False,
                         title=_NOTE + note, title_fontsize=7)
  legend.get_title().set_color("0.35")
  figure.suptitle(title)


def plot_fig1(rows: Sequence[Row], title: str = "fig1") -> Figure:
  """Figure 1: i1k accuracy (left) and 10-shot average (right) against core hours (log x), one
  line per attention through the model sizes (points labelled with their variant)."""
  figure = _new_figure(11, 4.8)
  axes = figure.subplots(1, 2)
  attentions = _ordered(r.args["attention"] for r in rows)
  panels = ((ACCURACY, "ImageNet-1k accuracy"), (FEWSHOT, "10-shot linear transfer (avg of 8)"))
  for ax, (metric, ylabel) in zip(axes, panels, strict=True):
    missing = []
    for i, attention in enumerate(attentions):
      points = []
      for row in rows:
        if row.args["attention"] != attention:
          continue
        x, y = row.value(CORE_HOURS), row.value(metric)
        if x is None or y is None or x <= 0:
          missing.append((attention, row.args["variant"]))
        else:
          points.append((x, y, row))
      points.sort(key=lambda p: p[0])
      color = _COLORS[i % len(_COLORS)]
      _draw_points(ax, points, color=color, label=_label(attention))
      for x, y, row in points:
        ax.annotate(row.args["variant"], (x, y), textcoords="offset points", xytext=(4, -10),
                    fontsize=7, color=color)
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
    ax.set_xlabel("TPU core hours")
    ax.set_ylabel(ylabel)
    ax.set_title(_missing_title(ylabel, len(missing)), fontsize=10)
    _percent_axis(ax)
  _finish_figure(figure, title, axes[0], ncol=len(attentions), note=_NOTE_LIST)
  return figure


def _alpha_panel(ax: Axes, rows: Sequence[Row],
                 series: Sequence[tuple[str, Callable[[Row], bool], str, str]]) -> int:
  """Accuracy against alpha: one line per (label, predicate, color, linestyle) of `series`
  (drawn even when empty, so every panel has the same lines). Returns the number of runs
  without a value."""
  missing = 0
  for label, selects, color, linestyle in series:
    selected = sorted((r for r in rows if selects(r)), key=lambda r: r.args["alpha"])
    points = [(r.args["alpha"], r.value(ACCURACY), r) for r in selected
              if r.value(ACCURACY) is not None]
    absent = [r.args["alpha"] for r in selected if r.value(ACCURACY) is None]
    _draw_points(ax, points, color=color, linestyle=linestyle, label=label)
    _mark_missing_x(ax, absent, color)
    missing += len(absent)
  ax.set_xlim(-0.08, 2.08)
  _percent_axis(ax)
  return missing


def plot_fig2(rows: Sequence[Row], title: str = "fig2") -> Figure:
  """Figure 2: rows i21k / i1k, columns S/32 S/16 S/8; i1k accuracy against alpha, one line per
  activation, softmax as a horizontal dashed line (dotted while running)."""
  datasets = [d for d in ("i21k", "i1k") if any(r.dataset == d for r in rows)]
  datasets += _ordered(r.dataset for r in rows if r.dataset not in datasets)
  variants = _variants(rows)
  activations = _ordered(r.args["attention"] for r in rows if r.args["attention"] != "softmax")
  figure = _new_figure(4.3 * len(variants), 3.6 * len(datasets) + 0.9)
  axes = figure.subplots(len(datasets), len(variants), sharey="row", squeeze=False)
  row_names = {"i21k": "ImageNet-21k, 30 ep", "i1k": "ImageNet-1k, 300 ep"}
  for i, dataset in enumerate(datasets):
    for j, variant in enumerate(variants):
      ax = axes[i][j]
      panel = [r for r in rows if r.dataset == dataset and r.args["variant"] == variant]
      series = [(a, lambda r, a=a: r.args["attention"] == a, _COLORS[k % len(_COLORS)],
                 "-") for k, a in enumerate(activations)]
      missing = _alpha_panel(ax, panel, series)
      for softmax in (r for r in panel if r.args["attention"] == "softmax"):
        value = softmax.value(ACCURACY)
        if value is None:
          missing += 1
        else:
          ax.axhline(value, color="black", linewidth=1.2, label="softmax",
                     linestyle="--" if softmax.status == "finished" else ":")
      ax.set_title(_missing_title(f"{dataset} {variant}", missing), fontsize=10)
      if i == len(datasets) - 1:
        ax.set_xlabel(r"$\alpha$  (weights $L^{-\alpha}\,h(q\cdot k/\sqrt{d})$)")
      if j == 0:
        ax.set_ylabel(f"ImageNet-1k accuracy\n({row_names.get(dataset, dataset)})")
  handles_from = max(axes.flat, key=lambda a: len(a.get_legend_handles_labels()[1]))
  _finish_figure(figure, title, handles_from, ncol=len(activations) + 1)
  return figure


def _variants(rows: Sequence[Row]) -> list[str]:
  present = _ordered(r.args["variant"] for r in rows)
  return [v for v in VARIANTS_ALPHA if v in present] + [v for v in present
                                                         if v not in VARIANTS_ALPHA]


def _plot_ablation(rows: Sequence[Row], title: str, flag: str, on: str, off: str) -> Figure:
  """Figures 3 and 4: columns = variants; accuracy against alpha, one line per activation x
  `flag` (colour = activation, solid = flag on, dashed = off)."""
  variants = _variants(rows)
  activations = _ordered(r.args["attention"] for r in rows)
  figure = _new_figure(4.3 * len(variants), 4.5)
  axes = figure.subplots(1, len(variants), sharey=True, squeeze=False)[0]
  series = [(f"{a}, {on if value else off}",
             lambda r, a=a, value=value: r.args["attention"] == a and r.args[flag] == value,
             _COLORS[k % len(_COLORS)], "-" if value else "--")
            for k, a in enumerate(activations) for value in (True, False)]
  for j, variant in enumerate(variants):
    ax = axes[j]
    missing = _alpha_panel(ax, [r for r in rows if r.args["variant"] == variant], series)
    ax.set_title(_missing_title(f"{rows[0].dataset if rows else ''} {variant}", missing),
                 fontsize=10)
    ax.set_xlabel(r"$\alpha$  (weights $L^{-\alpha}\,h(q\cdot k/\sqrt{d})$)")
    if j == 0:
      ax.set_ylabel("ImageNet-1k accuracy")
  _finish_figure(figure, title, axes[0], ncol=len(series))
  return figure


def plot_fig3(rows: Sequence[Row], title: str = "fig3") -> Figure:
  """Figure 3: with / without qk-layernorm (solid / dashed) for each activation."""
  return _plot_ablation(rows, title, "qk_norm", "qk-LN", "no qk-LN")


def plot_fig4(rows: Sequence[Row], title: str = "fig4") -> Figure:
  """Figure 4: with / without the attention gate (solid / dashed) for each activation."""
  return _plot_ablation(rows, title, "gated", "gate", "no gate")


PLOTS: dict[str, Callable[[Sequence[Row], str], Figure]] = {
    "fig1": plot_fig1, "fig2": plot_fig2, "fig3": plot_fig3, "fig4": plot_fig4}


def figure_kind(name: str) -> str | None:
  """'fig1'..'fig4' for a sweep named fig1..fig4 (or e.g. 'fig2_small'), else None."""
  match = re.match(r"(fig[1-4])(?![0-9])", name)
  return match.group(1) if match else None


def plot_sweep(name: str, rows: Sequence[Row]) -> Figure | None:
  """The figure of the sweep called `name` (by its figure number), None for other sweeps (or
  no rows)."""
  kind = figure_kind(name)
  return PLOTS[kind](rows, name) if kind and rows else None


# --------------------------------------------------------------------------------------- CLI


def write_report(sweep_path: str, root: str, out: str) -> dict[str, str]:
  """Collects a sweep and writes <out>/<sweep>.csv, .md and (fig1..fig4) .png.

  Returns {'csv': path, 'md': path, 'png': path (only when a figure was drawn)}.
  """
  name = sweep_lib.sweep_name(sweep_path)
  rows = collect(sweep_path, root)
  out_dir = epath.Path(out)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {"csv": out_dir / f"{name}.csv", "md": out_dir / f"{name}.md"}
  paths["csv"].write_text(to_csv(rows))
  paths["md"].write_text(to_markdown(rows, title=f"{name} ({root})"))
  figure = plot_sweep(name, rows)
  if figure is not None:
    paths["png"] = out_dir / f"{name}.png"
    with paths["png"].open("wb") as f:
      figure.savefig(f, format="png", dpi=130)
  return {k: str(v) for k, v in paths.items()}


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m big_vision_relu.report --sweep FILE [--sweep FILE ...] --root DIR --out DIR`."""
  parser = argparse.ArgumentParser(
      prog="python -m big_vision_relu.report",
      description="Tables (CSV, Markdown) and the paper's figure of sweeps, from their runs' "
                  "metrics.jsonl under ROOT/<sweep>/<run id>.")
  parser.add_argument("--sweep", action="append", required=True,
                      help="a sweep file (configs/paper/fig2.py); may be repeated")
  parser.add_argument("--root", required=True, help="the workdir root (local or gs://)")
  parser.add_argument("--out", default="docs/results", help="output directory (local or gs://)")
  args = parser.parse_args(argv)
  for sweep_path in args.sweep:
    paths = write_report(sweep_path, args.root, args.out)
    print(paths["md"])
    print(paths.get("png", f"(no figure for {sweep_lib.sweep_name(sweep_path)}: not fig1..fig4)"))
    sys.stdout.flush()


if __name__ == "__main__":
  main()
