r"""A sweep's figure (Figures 1-4 of the paper), as a matplotlib `Figure` drawn with the Agg
canvas (`plot_sweep` returns it), from the rows of `run_status.collect`.

The figures plot the seed groups' means (`stats.group_rows`), with bars of ± 1 std where a
group has 2 values or more:

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

import re
from collections.abc import Callable, Sequence

from matplotlib import ticker, transforms
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend

from big_vision_relu.experiments import sweep as sweep_lib
from big_vision_relu.experiments.run_status import CORE_HOURS, Row
from big_vision_relu.experiments.stats import (GATED, Group, Stat, group_rows, has_seeds, ordered,
                                               panel_values)

_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
_NOTE = "filled marker: finished, hollow marker: running (last logged value); "
_NOTE_SEEDS = "points: mean over seeds (filled once all finished), bars: ± 1 std"
_NOTE_X = "x on the x axis: no value (run missing or not evaluated yet)"
_NOTE_LIST = "runs without a value are listed in the panel"
_ALPHA_LABEL = r"$\alpha$  (weights $L^{-\alpha}\,h(q\cdot k/\sqrt{d})$)"

# (x, the Stat of the plotted metric, the group).
_Point = tuple[float, Stat, Group]


def _new_figure(width: float, height: float) -> Figure:
  figure = Figure(figsize=(width, height), layout="constrained")
  FigureCanvasAgg(figure)
  return figure


def _label(attention: str) -> str:
  """Figure 1's legend: the paper's name for relu attention with alpha = 1."""
  return "relu/seqlen" if attention == "relu" else attention


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


class _PlainLogFormatter(ticker.LogFormatter):
  """LogFormatter's choice of which ticks to label, written as plain numbers: 0.6, not 6e-01."""

  def __call__(self, x: float, pos: int | None = None) -> str:
    return f"{x:g}" if super().__call__(x, pos) else ""


def _log_x_axis(ax: Axes) -> None:
  """A log x scale labelled in plain numbers; its minor ticks too when it spans under a decade."""
  ax.set_xscale("log")
  ax.xaxis.set_major_formatter(_PlainLogFormatter())
  ax.xaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def _finish_figure(figure: Figure, title: str, handles_from: Axes, ncol: int, *, seeds: bool,
                   note: str = _NOTE_X) -> None:
  """Suptitle, and a legend below the panels headed by the marker conventions (and the seeds'
  when the runs have a seed). A legend wider than the figure would be cut at its edges, so the
  conventions take a line each, or two if that is too wide, and the entries as many columns (at
  most `ncol`) as fit the figure's width; a one-panel figure gets the narrower layouts."""
  handles, labels = handles_from.get_legend_handles_labels()
  seeds_line = [_NOTE_SEEDS] if seeds else []
  layouts = ([_NOTE + note] + seeds_line, [_NOTE.rstrip("; "), note] + seeds_line)
  renderer = figure.canvas.get_renderer()

  def add_legend(conventions: list[str], columns: int) -> Legend:
    legend = figure.legend(handles, labels, loc="outside lower center", ncol=columns,
                           frameon=False, title="\n".join(conventions), title_fontsize=7)
    legend.get_title().set_color("0.35")
    return legend

  def width(artist: Artist) -> float:
    return artist.get_window_extent(renderer).width

  def title_fits(conventions: list[str]) -> bool:
    legend = add_legend(conventions, 1)
    fits = width(legend.get_title()) <= figure.bbox.width
    legend.remove()
    return fits

  conventions = next((lines for lines in layouts if title_fits(lines)), layouts[-1])
  for columns in range(max(ncol, 1), 0, -1):
    legend = add_legend(conventions, columns)
    # Without a frame the legend's border padding is blank: it may fall outside the figure.
    blank = 2 * legend.borderpad * legend.prop.get_size_in_points() * figure.dpi / 72
    if columns == 1 or width(legend) - blank <= figure.bbox.width:
      break
    legend.remove()
  figure.suptitle(title)


def plot_fig1(rows: Sequence[Row], spec: sweep_lib.FigureSpec, title: str = "fig1") -> Figure:
  """Figure 1: accuracy (left) and few-shot transfer (right) against core hours (log x), one
  line per attention through the model sizes (points labelled with their variant, or size)."""
  groups = group_rows(rows)
  figure = _new_figure(11, 4.8)
  axes = figure.subplots(1, 2)
  attentions = ordered(g.args["attention"] for g in groups)
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
          for a in ordered(a for a, _ in missing)), transform=ax.transAxes, ha="right",
                     va="bottom", fontsize=7, color="0.3", gid="missing", zorder=1.5,
                     bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.7})
      note.set_in_layout(False)
    _log_x_axis(ax)
    ax.margins(x=0.1, y=0.08)
    ax.set_xlabel(spec.core_hours_label)
    ax.set_ylabel(ylabel)
    ax.set_title(_missing_title(ylabel, len(missing)), fontsize=10)
    _percent_axis(ax)
  _finish_figure(figure, title, axes[0], ncol=len(attentions), seeds=has_seeds(rows),
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
  datasets += ordered(g.dataset for g in groups if g.dataset not in datasets)
  values = panel_values(groups, spec.panel_key)
  activations = ordered(g.args["attention"] for g in groups if g.args["attention"] != "softmax")
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
  _finish_figure(figure, title, handles_from, ncol=len(activations) + 1, seeds=has_seeds(rows))
  return figure


def _plot_ablation(rows: Sequence[Row], spec: sweep_lib.FigureSpec, title: str, flag: str,
                   on: str, off: str) -> Figure:
  """Figures 3 and 4: columns = values of the spec's panel_key; accuracy against alpha, one
  line per activation x `flag` (colour = activation, solid = flag on, dashed = off)."""
  groups = group_rows(rows)
  values = panel_values(groups, spec.panel_key)
  activations = ordered(g.args["attention"] for g in groups)
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
  _finish_figure(figure, title, axes[0], ncol=len(series), seeds=has_seeds(rows))
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
