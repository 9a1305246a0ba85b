r"""The alpha-length study's report, redrawn from its archive (docs/alpha_length.md, section 6).

    python -m big_vision_relu.experiments.studies.alpha_length.report \
        --archive results/alpha_length --out docs/alpha_length
    bash launch/study.sh alpha_length report       # the same (the study's PLAN.report)

Writes `<out>/results.md` (per length: each cell's validation score and test result over seeds,
its distance from attention off and from softmax, the attention statistics at the start and the
end; alpha*(L) with its bootstrap interval; the verdict by the pre-registered rule once a length's
grid is complete; relu/L against softmax; the trivial baselines; the compute spent; which CPU
model trained each run) and three figures: `accuracy_vs_alpha.png`, `alpha_star.png` and
`mixing.png` (each cell against attention off, by its row sum and its attention share).
Everything is computed by `protocol`'s functions (the protocol's code) from the archived
metrics.jsonl, launches.jsonl and provenance.json.
"""
from __future__ import annotations

import dataclasses
import json
import operator
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import app, flags
from matplotlib import ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import provenance, run_status
from big_vision_relu.experiments.studies.alpha_length import protocol as al

ATTENTION_STATS = ("row_sum_mean", "attention_to_residual")
VAL_SCORE = operator.attrgetter("val_best")  # the rule's readout (section 3)
# Other readouts of a run, alpha* through each reported beside the rule's (description only).
READOUTS = {"best val (the rule)": VAL_SCORE, "final val": operator.attrgetter("val_final"),
            "test at the selected step": operator.attrgetter("test_at_best"),
            "final test": operator.attrgetter("test_final")}


@dataclasses.dataclass(frozen=True)
class Archived:
  """One archived run of the grid."""
  run: Any  # sweep.Run
  result: al.RunResult
  first: dict[str, float]  # the attention statistics at step 1 (the initialisation)
  last: dict[str, float]  # ... at the last step
  core_hours: float
  cpus: str = "-"  # which CPU model trained which steps (`provenance.describe`)


def _layer_stats(record: Mapping[str, Any]) -> dict[str, float]:
  return {k.removeprefix("attention/"): float(v) for k, v in record.items()
          if k.startswith("attention/layer") and k.rsplit("/", 1)[1] in ATTENTION_STATS}


def collect(archive: pathlib.Path) -> list[Archived]:
  """Every run of the grid that is archived and finished (its last step logged)."""
  found = []
  for patch in al.PATCH_TO_LENGTH:
    for run in al.runs(patch):
      path = archive / "runs" / run.run_id
      if not (path / metrics_lib.JSONL_NAME).exists():
        continue
      records = metrics_lib.read_metrics(path)
      rows = [dict(r, step=s) for s, r in records.items()]
      with_stats = [s for s, r in records.items() if _layer_stats(r)]
      found.append(Archived(run, al.run_result(rows), _layer_stats(records[with_stats[0]]),
                            _layer_stats(records[with_stats[-1]]), run_status.core_hours(records),
                            provenance.describe(provenance.starts(path))))
  return found


def _cell(run: Any) -> str:
  attention = run.args["attention"]
  return f"relu a{run.args['alpha']:g}" if attention == "relu" else attention


def _by_cell(runs: Sequence[Archived], patch: int) -> dict[str, dict[int, Archived]]:
  """cell name -> seed -> run, at one patch size, in the grid's cell order."""
  cells: dict[str, dict[int, Archived]] = {}
  for cell in al.cells(patch):
    cells[_cell(al.GRID.run(**cell))] = {}
  for item in runs:
    if item.run.args["patch"] == patch:
      cells[_cell(item.run)][item.run.args["seed"]] = item
  return cells


def cpu_lines(runs: Sequence[Archived]) -> list[str]:
  """Markdown lines: which CPU model trained which runs, per length and seed, and the relu/L -
  softmax seed pairs whose two runs did not train on the same one (description: the protocol's
  machines are "the 2-core CPU VMs", whose CPU models differ between sessions)."""
  lines, crossed = ["## Which CPU model trained each run (description)", ""], []
  for patch, length in al.PATCH_TO_LENGTH.items():
    cells = _by_cell(runs, patch)
    for seed in al.SEEDS:
      groups: dict[str, list[str]] = {}
      for name, by_seed in cells.items():
        if seed in by_seed:
          groups.setdefault(by_seed[seed].cpus, []).append(name)
      if groups:
        lines.append(f"- L = {length}, seed {seed}: " + "; ".join(
            f"{cpus} (" + (f"all {len(names)} cells" if len(names) == len(cells)
                           else ", ".join(names)) + ")" for cpus, names in groups.items()))
      pair = [cells[name].get(seed) for name in ("relu a1", "softmax")]
      if None not in pair and pair[0].cpus != pair[1].cpus:
        crossed.append(f"L = {length} seed {seed}")
  return lines + ["", "relu/L (alpha 1) - softmax seed pairs trained on different CPU models: "
                  + (", ".join(crossed) or "none") + ".", ""]


def _mean_se(values: Sequence[float]) -> str:
  if not values:
    return "-"
  v = 100 * np.asarray(values, np.float64)
  se = f" +- {v.std(ddof=1) / np.sqrt(len(v)):.2f}" if len(v) > 1 else ""
  return f"{v.mean():.2f}{se} (n={len(v)})"


def _paired_test(a: Mapping[int, Archived], b: Mapping[int, Archived]) -> al.PairedTest | None:
  """a - b on the test results of the seeds both have (None below two pairs)."""
  seeds = sorted(set(a) & set(b))
  if len(seeds) < 2:
    return None
  return al.paired_test([a[s].result.test_at_best for s in seeds],
                        [b[s].result.test_at_best for s in seeds])


def _paired(a: Mapping[int, Archived], b: Mapping[int, Archived]) -> str:
  test = _paired_test(a, b)
  if test is None:
    return "-"
  return f"{100 * test.mean:+.2f} [{100 * test.lower:+.2f}, {100 * test.upper:+.2f}]"


def _last_layer(items: Sequence[Archived]) -> int:
  return max(int(k.split("/")[0].removeprefix("layer")) for k in items[0].last)


def _stat_mean(items: Sequence[Archived], key: str, when: str) -> float:
  """The seed mean of one last-layer attention statistic at `when` ('first' or 'last')."""
  layer = _last_layer(items)
  return float(np.mean([getattr(i, when).get(f"layer{layer}/{key}", np.nan) for i in items]))


def complete_accuracies(runs: Sequence[Archived],
                        readout: Callable[[al.RunResult], float] = VAL_SCORE) -> al.Accuracies:
  """L -> alpha -> per-seed `readout` (the rule's: the validation score), for the lengths
  whose relu grid has every seed."""
  accuracies = {}
  for patch, length in al.PATCH_TO_LENGTH.items():
    by_alpha = {}
    for alpha in al.ALPHAS[length]:
      seeds = {r.run.args["seed"]: readout(r.result) for r in runs
               if r.run.args["patch"] == patch and r.run.args["attention"] == "relu"
               and r.run.args["alpha"] == alpha}
      by_alpha[alpha] = [seeds[s] for s in al.SEEDS if s in seeds]
    if all(len(v) == len(al.SEEDS) for v in by_alpha.values()):
      accuracies[length] = by_alpha
  return accuracies


def length_table(runs: Sequence[Archived], patch: int) -> list[str]:
  """Markdown lines: one length's cells."""
  length = al.PATCH_TO_LENGTH[patch]
  cells = _by_cell(runs, patch)
  lines = [f"### L = {length} (patch {patch})", "",
           "| cell | val score (best val/prec@1) | test at the selected step | final test | "
           "- attention off (test, 90% t) | - softmax (test, 90% t) | row sum, last layer "
           "(start -> end) | attention / residual, last layer (start -> end) |",
           "|---|---|---|---|---|---|---|---|"]
  for name, seeds in cells.items():
    items = [seeds[s] for s in sorted(seeds)]

    def stat(key: str, items=items) -> str:
      if not items:
        return "-"
      return f"{_stat_mean(items, key, 'first'):.3f} -> {_stat_mean(items, key, 'last'):.3f}"
    lines.append(
        f"| {name} | {_mean_se([i.result.val_best for i in items])} | "
        f"{_mean_se([i.result.test_at_best for i in items])} | "
        f"{_mean_se([i.result.test_final for i in items])} | "
        f"{_paired(seeds, cells['zero']) if name != 'zero' else ''} | "
        f"{_paired(seeds, cells['softmax']) if name != 'softmax' else ''} | "
        f"{stat('row_sum_mean')} | {stat('attention_to_residual')} |")
  return lines + [""]


def verdict_lines(runs: Sequence[Archived]) -> list[str]:
  """Markdown lines: alpha* of every complete length (with the 5-95% range of its bootstrap over
  seeds, as drawn in alpha_star.png) and the rule's verdict (interim with two lengths)."""
  accuracies = complete_accuracies(runs)
  lines = ["## alpha*(L) and the verdict", ""]
  for length, star in sorted(al.alpha_stars(accuracies).items()):
    low, high = np.percentile(_bootstrap_stars(accuracies[length]), [5, 95])
    lines.append(f"- L = {length}: alpha* = {star.alpha:.2f}"
                 + (" (censored at the grid's end)" if star.censored else "")
                 + f"; 5-95% over bootstrap resamples of its seeds [{low:.2f}, {high:.2f}]")
  if len(accuracies) < 2:
    return lines + ["", "The verdict: not yet: complete grids at L = "
                    f"{sorted(accuracies) or 'none'}; the rule needs two lengths (interim) or "
                    "three (final).", ""]
  decision = al.decide(accuracies)
  kind = "final" if len(accuracies) == len(al.PATCH_TO_LENGTH) else "interim"
  lines += ["", f"- slope of alpha* on ln L: {decision.slope:+.3f}, 90% bootstrap interval "
            f"[{decision.interval[0]:+.3f}, {decision.interval[1]:+.3f}]; H1 predicts 0, H0 "
            f"{decision.h0_slope:+.3f}",
            f"- **{kind} verdict ({', '.join(map(str, sorted(accuracies)))}): "
            f"{decision.verdict}** ({decision.reason})", ""]
  return lines


def readout_lines(runs: Sequence[Archived]) -> list[str]:
  """Markdown lines: alpha* of every complete length through each of READOUTS, the rule's first
  (point estimates of the seed means). Description beside the rule: the rule reads validation
  only, and the test split selects nothing."""
  columns = sorted(complete_accuracies(runs))
  if not columns:
    return []
  lines = ["## alpha* through other readouts of the same runs (description, not the rule)", "",
           "| readout | " + " | ".join(f"alpha*({length})" for length in columns) + " |",
           "|---|" + "---|" * len(columns)]
  for name, readout in READOUTS.items():
    stars = al.alpha_stars(complete_accuracies(runs, readout))
    lines.append(f"| {name} | " + " | ".join(
        f"{stars[n].alpha:.2f}" + (" (censored)" if stars[n].censored else "")
        for n in columns) + " |")
  return lines + [""]


def attention_off_lines(runs: Sequence[Archived]) -> list[str]:
  """Markdown lines: section 5's reading of the verdict. At every complete length, the
  validation argmax (the grid point alpha* is fitted around) minus attention off, seed-paired
  test results; where that cell is not better than attention off, the verdict there is not
  evidence about the normaliser."""
  accuracies = complete_accuracies(runs)
  if not accuracies:
    return []
  lines = ["## The validation argmax against attention off (section 5)", ""]
  patches = {length: patch for patch, length in al.PATCH_TO_LENGTH.items()}
  not_better = []
  for length, by_alpha in sorted(accuracies.items()):
    alphas = sorted(by_alpha)
    best = alphas[al.grid_argmax([np.mean(by_alpha[a]) for a in alphas])]
    cells = _by_cell(runs, patches[length])
    test = _paired_test(cells[f"relu a{best:g}"], cells["zero"])
    if test is None:
      lines.append(f"- L = {length}: relu alpha {best:g} - attention off: attention off has "
                   "fewer than two seeds archived")
      not_better.append(length)
      continue
    lines.append(f"- L = {length}: relu alpha {best:g} - attention off "
                 f"{100 * test.mean:+.2f} points, 90% [{100 * test.lower:+.2f}, "
                 f"{100 * test.upper:+.2f}]: {'better' if test.superior else 'not better'}")
    if not test.superior:
      not_better.append(length)
  lines += ["", (f"At L = {', '.join(map(str, not_better))} the best alpha is not better than "
                 "attention off (section 5: it wins by switching attention off): the verdict is "
                 "not evidence about the normaliser there."
                 if not_better else "At every complete length the best alpha is better than "
                 "attention off."), ""]
  return lines


def relu_vs_softmax_lines(runs: Sequence[Archived]) -> list[str]:
  lines = ["## relu/L (alpha 1) - softmax, test results, paired by seed (margin 1 point)", ""]
  for patch, length in al.PATCH_TO_LENGTH.items():
    cells = _by_cell(runs, patch)
    relu, softmax = cells["relu a1"], cells["softmax"]
    seeds = sorted(set(relu) & set(softmax))
    if len(seeds) < len(al.SEEDS):
      lines.append(f"- L = {length}: {len(seeds)} of {len(al.SEEDS)} seed pairs archived")
      continue
    t = al.paired_test([relu[s].result.test_at_best for s in seeds],
                       [softmax[s].result.test_at_best for s in seeds])
    lines.append(f"- L = {length}: {100 * t.mean:+.2f} points (SE {100 * t.se:.2f}; 90% "
                 f"[{100 * t.lower:+.2f}, {100 * t.upper:+.2f}]): {t.verdict}")
  return lines + [""]


def baseline_lines(archive: pathlib.Path) -> list[str]:
  lines = ["## Trivial baselines (the same 55,000 / 5,000 / 10,000 images)", ""]
  for patch, length in al.PATCH_TO_LENGTH.items():
    path = archive / "baselines" / f"p{patch}.json"
    if not path.exists():
      lines.append(f"- L = {length}: not computed (python -m "
                   "big_vision_relu.experiments.baselines, docs/alpha_length.md)")
      continue
    b = al.trivial_baselines(json.loads(path.read_text()))
    lines.append(
        f"- L = {length}: pixel 1-NN val {b['val/pixel_1nn']:.4f}, test "
        f"{b['test/pixel_1nn']:.4f}; pixel ridge val {b['val/pixel_ridge']:.4f}, test "
        f"{b['test/pixel_ridge']:.4f}; the random network (seed mean) 1-NN val "
        f"{b['val/random_1nn']:.4f}, test {b['test/random_1nn']:.4f}, ridge val "
        f"{b['val/random_ridge']:.4f}, test {b['test/random_ridge']:.4f}; 10-shot "
        f"transfer: raw pixels {b['pixels_10shot']:.3f}, random init {b['random_10shot']:.3f}")
  return lines + [""]


def plot_accuracy(runs: Sequence[Archived]) -> Figure:
  """Validation score and test result against alpha, one panel per length; softmax and
  attention off as horizontal lines (seed means, bars +- 1 SE)."""
  figure = Figure(figsize=(4 * len(al.PATCH_TO_LENGTH), 3.4), layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.subplots(1, len(al.PATCH_TO_LENGTH), squeeze=False)[0]
  for ax, (patch, length) in zip(axes, al.PATCH_TO_LENGTH.items()):
    cells = _by_cell(runs, patch)
    for key, style, label in (("val_best", "o-", "validation score"),
                              ("test_at_best", "s--", "test at the selected step")):
      xs, ys, es = [], [], []
      for alpha in al.ALPHAS[length]:
        values = [getattr(i.result, key) for i in cells[f"relu a{alpha:g}"].values()]
        if values:
          xs.append(alpha)
          ys.append(100 * np.mean(values))
          es.append(100 * np.std(values, ddof=1) / np.sqrt(len(values)) if len(values) > 1
                    else 0)
      if xs:
        ax.errorbar(xs, ys, yerr=es, fmt=style, capsize=3, label=f"relu, {label}")
    for name, color in (("softmax", "black"), ("zero", "gray")):
      values = [i.result.test_at_best for i in cells[name].values()]
      if values:
        ax.axhline(100 * np.mean(values), color=color, linestyle=":",
                   label=f"{'attention off' if name == 'zero' else name}, test")
    ax.set_title(f"L = {length} (patch {patch})")
    ax.set_xlabel(r"$\alpha$ (weights $L^{-\alpha}$ relu$(q\cdot k/\sqrt{d})$)")
    ax.set_ylabel("accuracy (%)")
  if axes[0].get_legend_handles_labels()[0]:
    axes[0].legend(fontsize=7)
  return figure


MIXING_AXES = (("row_sum_mean", "row sum of the attention weights"),
               ("attention_to_residual", "|attention branch| / |residual stream|"))


def plot_mixing(runs: Sequence[Archived]) -> Figure:
  """Each cell's test result minus attention off's (seed-paired mean, bars its 90% t interval)
  against its last layer's attention statistics at the end of training (seed means): the mean
  row sum of the weights (softmax's is 1) and the attention branch's norm over the residual
  stream's (attention off's is its output bias), one panel each, one series per length: whether
  a cell's lead over no mixing vanishes as its weights go to 0, and whether its branch does
  (docs/alpha_length.md, section 5, attention off)."""
  figure = Figure(figsize=(10, 3.8), layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.subplots(1, len(MIXING_AXES))
  for ax, (key, description) in zip(axes, MIXING_AXES):
    for patch, length in al.PATCH_TO_LENGTH.items():
      cells = _by_cell(runs, patch)
      points = []  # (statistic, difference, lower, upper, label)
      for name, seeds in cells.items():
        test = _paired_test(seeds, cells["zero"]) if name != "zero" else None
        if test is not None:
          points.append((_stat_mean([seeds[s] for s in sorted(seeds)], key, "last"),
                         100 * test.mean, 100 * test.lower, 100 * test.upper,
                         name.removeprefix("relu a")))
      if not points:
        continue
      *numbers, labels = zip(*points)
      x, y, low, high = np.asarray(numbers, np.float64)
      line = ax.errorbar(x, y, yerr=[y - low, high - y], fmt="o", capsize=3,
                         label=f"L = {length}")
      for xi, yi, label in zip(x, y, labels):
        ax.annotate(label, (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=6,
                    color=line[0].get_color())
    ax.axhline(0, color="gray", linestyle=":")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
    ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel(f"{description}, last layer, end of training")
    ax.set_ylabel("test - attention off (points)")
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  figure.suptitle("relu alphas (labelled) and softmax against no token mixing")
  return figure


def _bootstrap_stars(by_alpha: Mapping[float, Sequence[float]]) -> np.ndarray:
  """alpha* of one length over the protocol's bootstrap resamples of its seeds."""
  rng = np.random.Generator(np.random.PCG64(al.BOOTSTRAP_SEED))
  grid = sorted(by_alpha)
  table = np.asarray([by_alpha[a] for a in grid], np.float64)  # [alphas, seeds]
  return np.asarray([
      al.alpha_star(grid, table[:, rng.integers(0, table.shape[1], table.shape[1])].mean(1)).alpha
      for _ in range(al.BOOTSTRAP_SAMPLES)])


def plot_alpha_star(runs: Sequence[Archived]) -> Figure:
  """alpha*(L) (seed means; bars: the 5-95% bootstrap range per length) against ln L, with H1's
  constant and H0's K / ln L through the point estimates."""
  figure = Figure(figsize=(4.5, 3.4), layout="constrained")
  FigureCanvasAgg(figure)
  ax = figure.subplots()
  accuracies = complete_accuracies(runs)
  if accuracies:
    lengths = sorted(accuracies)
    stars = al.alpha_stars(accuracies)
    points = np.asarray([stars[n].alpha for n in lengths])
    ranges = np.asarray([np.percentile(_bootstrap_stars(accuracies[n]), [5, 95])
                         for n in lengths])
    x = np.log(lengths)
    ax.errorbar(x, points, yerr=[points - ranges[:, 0], ranges[:, 1] - points], fmt="o",
                capsize=3, color="black", label=r"$\alpha^*(L)$, 5-95% bootstrap")
    grid = np.linspace(np.log(12), np.log(260), 50)
    inv = 1 / x
    k = float(np.sum(inv * points) / np.sum(inv ** 2))
    ax.plot(grid, np.full_like(grid, points.mean()), "--", label=r"H1: $\alpha^*$ constant")
    ax.plot(grid, k / grid, ":", label=r"H0: $\alpha^* = K / \ln L$")
  ax.set_xlabel(r"$\ln L$")
  ax.set_ylabel(r"$\alpha^*$")
  ax.set_title("the best alpha against the sequence length")
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=7)
  return figure


def write(archive: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  """Writes results.md and the figures into `out`; returns results.md's path."""
  runs = collect(archive)
  planned = sum(len(al.runs(p)) for p in al.PATCH_TO_LENGTH)
  out.mkdir(parents=True, exist_ok=True)
  lines = ["# The alpha-length study: results", "",
           f"Redrawn from `{archive}` by `bash launch/study.sh alpha_length report`: {len(runs)} "
           f"of {planned} runs archived, {sum(r.core_hours for r in runs):.1f} core hours. The "
           "protocol, its rule and what each column means: docs/alpha_length.md. Accuracies in "
           "%, seed means +- SE; differences in points, seed-paired, with 90% t intervals.", ""]
  for patch in al.PATCH_TO_LENGTH:
    lines += length_table(runs, patch)
  lines += (verdict_lines(runs) + readout_lines(runs) + attention_off_lines(runs)
            + relu_vs_softmax_lines(runs) + baseline_lines(archive) + cpu_lines(runs))
  lines += ["![accuracy against alpha](accuracy_vs_alpha.png)", "",
            "![alpha* against ln L](alpha_star.png)", "",
            "![each cell against attention off, by its row sum](mixing.png)", ""]
  for name, figure in (("accuracy_vs_alpha.png", plot_accuracy(runs)),
                       ("alpha_star.png", plot_alpha_star(runs)),
                       ("mixing.png", plot_mixing(runs))):
    figure.savefig(out / name, dpi=110)
  path = out / "results.md"
  path.write_text("\n".join(lines))
  return path


def main(argv: list[str]) -> None:
  del argv
  print(write(pathlib.Path(FLAGS.archive), pathlib.Path(FLAGS.out)))


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_string("archive", "results/alpha_length", "The study's archive.")
  flags.DEFINE_string("out", "docs/alpha_length", "Where results.md and the figures go.")
  app.run(main)
