r"""The alpha-length study's controls at L = 49: (a) does relu/L's result survive
regularisation? (b) do softmax's and relu/L's curves over the training-set size run parallel?

    bash launch/study.sh alpha_length_controls          # trains what its gate lets train now
    bash launch/study.sh alpha_length_controls report   # docs/alpha_length/controls.md

The rules are docs/alpha_length.md's section 5 ("Control (a)") and section 7 (2026-12-01,
19:45 UTC: the candidates and the choice), written before any of these runs; this unit is
their code. A plan of its own (archive results/alpha_length_controls, its own pinned commit):
the grid's pinned commit (d165510) has no weight-decay or crop argument in
configs/study/fmnist_vit.py; the one pinned here adds `wd` and `crop` and changes nothing else
a grid run computes (at their defaults a run's config is the grid's).

Runs, at L = 49 (patch 4) with the grid's recipe (`protocol.GRID`) but the regulariser:
- phase 0, the candidates (`CANDIDATES`, seed 0, softmax): R1 weight decay 3e-4, R2 1e-3,
  R3 `inception_crop(28, area_min=50)` with the grid's 1e-4, R4 that crop with 3e-4;
- phase k (1-4), with R_k chosen: softmax seeds 1-2 and relu/L (alpha 1) seeds 0-2 under R_k
  (seed 0's softmax is its candidate run);
- phase 5, control (b) (docs/alpha_length.md 5, and 7 of 2026-12-03): softmax and relu/L
  (alpha 1) at seeds 0-2 on 7,500, 15,000 and 30,000 of the 55,000 training images (`SIZES`,
  stratified and nested: `train_images`, data/holdout.py), the grid's recipe otherwise (40
  epochs, so fewer steps); the grid's own runs are the 55,000 point.

The choice (`choose`): the first of R1-R4 whose validation loss at its last evaluation is
within LOSS_RISE of its minimum over the run's evaluations; if none is, the one with the
smallest such rise (reported as missing the criterion). The gate (`gate`) reads the grid's
archive, `results/alpha_length` beside this one: nothing trains until the grid at L = 49 is
archived (section 5: "after the L = 49 grid"); if the grid's softmax seed-0 run there already
meets the criterion the control is moot and nothing trains; else phase 0; then, as soon as the
archived candidates decide the choice (later ones cannot change it), the chosen candidate's
phase first, the candidates still unarchived only on the workers its runs leave idle; once it
is archived, those candidates and control (b) (docs/alpha_length.md 7, 2026-12-04 19:47 UTC,
says why the comparison goes first, and 21:30 UTC why idle workers take the candidates). A diverged
candidate never meets the criterion (an infinite rise); ties in the smallest rise go to the
first in R1-R4 order. relu/L - softmax is judged by section 5's paired rule
(`protocol.paired_test`); its result "survives" if the regularised verdict is the grid's at
L = 49. Control (b) opens once control (a)'s chosen comparison is archived (at once if (a) is
moot); its rule (`parallel_test`): per seed, the least-squares slope of relu/L - softmax on
log2(training images), in points per doubling; the curves are "parallel" when the 90% t
interval of the seeds' mean slope lies inside +-PARALLEL_MARGIN. Beside its table the report
sets the trivial baselines fitted on each size's own images (`size_baselines`; docs/alpha_length.md
7, 2026-12-05).
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import plans, run_status
from big_vision_relu.experiments.studies.alpha_length import protocol as al
from big_vision_relu.experiments.sweep import Grid, Run

if TYPE_CHECKING:
  from matplotlib.figure import Figure

PATCH = 4  # L = 49
GRID_STUDY = "alpha_length"  # the grid's archive: <archive>/../alpha_length
BASE_WD = 1e-4  # the grid's weight decay (fmnist_vit.py's default); crop 0: none
CANDIDATES: dict[str, dict[str, Any]] = {
    "R1": dict(wd=3e-4), "R2": dict(wd=1e-3), "R3": dict(crop=50), "R4": dict(crop=50, wd=3e-4)}
LOSS_RISE = 0.01  # val/loss at the end within this of its minimum: "no longer rises"
VAL_LOSS = "val/loss"
SIZES = (7_500, 15_000, 30_000)  # control (b)'s training images, beside the grid's
GRID_IMAGES = 60_000 - al.VALIDATION  # the grid's: all of the rest (train_images 0)
PARALLEL_MARGIN = 0.005  # control (b): +-0.5 points of accuracy per doubling of the images
# The grid's arguments, plus wd, crop and train_images before the seed; at the grid's values
# they stay out of the run ids and --config (implicit), so the unregularised run is the grid's.
GRID = Grid(al.CONFIG, {**{k: v for k, v in al.GRID.defaults.items() if k != "seed"},
                        "patch": PATCH, "wd": BASE_WD, "crop": 0, "train_images": 0, "seed": 0},
            implicit={"wd": BASE_WD, "crop": 0, "train_images": 0})
SIZES_PHASE = 1 + len(CANDIDATES)  # control (b)'s phase, after the candidates' comparisons


def candidate_runs() -> list[Run]:
  """Phase 0: each candidate's seed-0 softmax run."""
  return [GRID.run(attention="softmax", **args) for args in CANDIDATES.values()]


def comparison_runs(name: str) -> list[Run]:
  """R_k's comparison: softmax and relu/L (alpha 1) at seeds 0-2 under candidate `name`."""
  return [GRID.run(attention=attention, seed=seed, **CANDIDATES[name])
          for attention in ("softmax", "relu") for seed in al.SEEDS]


def size_runs() -> list[Run]:
  """Phase 5, control (b): softmax and relu/L (alpha 1) at seeds 0-2 on each of SIZES,
  smallest (cheapest) first."""
  return [GRID.run(attention=attention, seed=seed, train_images=images) for images in SIZES
          for attention in ("softmax", "relu") for seed in al.SEEDS]


def grid_softmax_run() -> Run:
  """The grid's own L = 49 softmax seed-0 run (the unregularised candidate)."""
  return al.GRID.run(patch=PATCH, attention="softmax", seed=0)


# ----------------------------------------------------------------------------- the choice

@dataclasses.dataclass(frozen=True)
class LossRise:
  minimum: float  # val/loss, min over the run's evaluations
  last: float  # at its last evaluation
  rise: float  # last - minimum (inf: the run diverged)

  @property
  def meets(self) -> bool:
    return self.rise <= LOSS_RISE


def _archived(run_dir: pathlib.Path) -> bool:
  return any((run_dir / name).exists() for name in (metrics_lib.JSONL_NAME,
                                                     run_status.DIVERGED_FILE))


def loss_rise(run_dir: pathlib.Path) -> LossRise | None:
  """The validation loss's rise from its minimum to the end of an archived run; None if the
  run is not archived."""
  if (run_dir / run_status.DIVERGED_FILE).exists():
    return LossRise(math.inf, math.inf, math.inf)
  if not (run_dir / metrics_lib.JSONL_NAME).exists():
    return None
  records = metrics_lib.read_metrics(run_dir)
  losses = [records[s][VAL_LOSS] for s in sorted(records) if VAL_LOSS in records[s]]
  if not losses:
    raise ValueError(f"{run_dir} logged no {VAL_LOSS}: not a run of this study's recipe.")
  return LossRise(min(losses), losses[-1], losses[-1] - min(losses))


@dataclasses.dataclass(frozen=True)
class Choice:
  name: str | None  # the chosen candidate; None while the archived ones cannot decide it
  meets: bool  # whether it meets the criterion (else: the smallest rise)
  rises: dict[str, LossRise | None]  # candidate -> its rise (None: not archived)


def choose(rises: Mapping[str, LossRise | None]) -> Choice:
  """Section 7's rule over the candidates' rises, in CANDIDATES order: the first that meets
  the criterion, chosen as soon as it and every candidate before it are archived (the later
  ones cannot change it); else, once all are archived, the smallest rise."""
  rises = {name: rises.get(name) for name in CANDIDATES}
  for name, rise in rises.items():
    if rise is None:
      return Choice(None, False, rises)
    if rise.meets:
      return Choice(name, True, rises)
  return Choice(min(rises, key=lambda n: rises[n].rise), False, rises)


def candidate_rises(archive: pathlib.Path) -> dict[str, LossRise | None]:
  return {name: loss_rise(archive / "runs" / run.run_id)
          for name, run in zip(CANDIDATES, candidate_runs(), strict=True)}


def grid_archive(archive: pathlib.Path) -> pathlib.Path:
  return archive.parent / GRID_STUDY


def gate(archive: pathlib.Path) -> tuple[tuple[int, ...], str]:
  """The phases that may train now, and why (`Plan.gate`)."""
  waiting = [run for run in al.runs(PATCH)
             if not (grid_archive(archive) / "runs" / run.run_id / metrics_lib.JSONL_NAME).exists()]
  if waiting:
    return (), (f"waiting for the grid at L = 49: {len(waiting)} of {len(al.runs(PATCH))} runs "
                f"not archived in {grid_archive(archive)}")
  unregularised = loss_rise(grid_archive(archive) / "runs" / grid_softmax_run().run_id)
  if unregularised.meets:
    return (SIZES_PHASE,), (f"control (a) moot: the grid's L = 49 softmax val loss rises "
                            f"{unregularised.rise:.4f} <= {LOSS_RISE} (docs/alpha_length.md 7); "
                            f"control (b) (phase {SIZES_PHASE})")
  choice = choose(candidate_rises(archive))
  if choice.name is None:
    return (0,), "choosing the regulariser (phase 0)"
  chosen = 1 + list(CANDIDATES).index(choice.name)
  if not all(_archived(archive / "runs" / run.run_id) for run in comparison_runs(choice.name)):
    # The comparison first: candidates not yet archived (phase 0) cannot change the choice;
    # they train on the workers its runs leave idle.
    return (chosen, 0), f"{choice.name} chosen; the candidates left take idle workers"
  return (0, chosen, SIZES_PHASE), (f"{choice.name} chosen, control (a) archived; control (b) "
                                    f"(phase {SIZES_PHASE})")


PLAN = plans.Plan(
    name="alpha_length_controls",
    sweeps={"candidates": candidate_runs,
            **{name: (lambda name=name: comparison_runs(name)) for name in CANDIDATES},
            "sizes": size_runs},
    phases=(("candidates", {}), *((name, {}) for name in CANDIDATES), ("sizes", {})),
    datasets=("mnist5k", "digits", "fashion_mnist_local"),
    data_packages=("dataset-fashion-mnist",), docs="docs/alpha_length", gate=gate,
    report="big_vision_relu.experiments.studies.alpha_length_controls")


# ----------------------------------------------------------------------------- the report

def grid_comparison_runs() -> list[Run]:
  """The grid's own softmax and relu/L (alpha 1) runs at L = 49, seeds 0-2."""
  return [GRID.run(attention=a, seed=s) for a in ("softmax", "relu") for s in al.SEEDS]


def _test_results(archive: pathlib.Path, runs: Sequence[Run]) -> dict[tuple[str, int], float]:
  found = {}
  for run in runs:
    path = archive / "runs" / run.run_id
    if (path / metrics_lib.JSONL_NAME).exists() and not (path / run_status.DIVERGED_FILE).exists():
      rows = [dict(r, step=s) for s, r in metrics_lib.read_metrics(path).items()]
      found[run.args["attention"], run.args["seed"]] = al.run_result(rows).test_at_best
  return found


def comparison(archive: pathlib.Path, runs: Sequence[Run]) -> al.PairedTest | None:
  """relu/L - softmax over the seeds of `runs` (None until all are archived)."""
  found = _test_results(archive, runs)
  if len(found) < len(runs):
    return None
  return al.paired_test([found["relu", s] for s in al.SEEDS],
                        [found["softmax", s] for s in al.SEEDS])


def parallel_test(sizes: Sequence[int], relu: Sequence[Sequence[float]],
                  softmax: Sequence[Sequence[float]]) -> al.PairedTest:
  """Control (b)'s rule. `relu[s][i]`, `softmax[s][i]`: seed s's test accuracy on `sizes[i]`
  training images. Per seed, the least-squares slope of relu - softmax on log2(size) (accuracy
  per doubling); the seeds' mean slope with the paired t interval at PARALLEL_MARGIN, so its
  `equivalent` is "parallel" (`lower` > 0: relu/L's lead grows with the images)."""
  x = np.log2(np.asarray(sizes, np.float64))
  slopes = [float(np.polyfit(x, np.subtract(r, s, dtype=np.float64), 1)[0])
            for r, s in zip(relu, softmax, strict=True)]
  return al.paired_test(slopes, [0.0] * len(slopes), margin=PARALLEL_MARGIN)


def parallel_power(slope: float, noise: float, trials: int = 2000, seed: int = 0) -> float:
  """How often `parallel_test` says "parallel" when relu/L - softmax has a true `slope` per
  doubling and each seed's difference at each size has independent normal `noise` (sd), at
  the sizes of SIZES and GRID_IMAGES: the rule's power (or, beyond the margin, its error)."""
  rng = np.random.Generator(np.random.PCG64(seed))
  sizes = (*SIZES, GRID_IMAGES)
  lead = slope * np.log2(np.asarray(sizes) / sizes[0])
  hits = sum(parallel_test(sizes, lead + noise * rng.standard_normal((len(al.SEEDS), len(sizes))),
                           np.zeros((len(al.SEEDS), len(sizes)))).equivalent
             for _ in range(trials))
  return hits / trials


def _size_groups(archive: pathlib.Path) -> dict[int, tuple[pathlib.Path, list[Run]]]:
  """Control (b)'s runs: training images -> (the archive that holds them, the runs); at
  GRID_IMAGES the grid's own runs."""
  groups = {images: (archive, [r for r in size_runs() if r.args["train_images"] == images])
            for images in SIZES}
  return {**groups, GRID_IMAGES: (grid_archive(archive), grid_comparison_runs())}


def size_curves(archive: pathlib.Path) -> dict[int, dict[tuple[str, int], float]]:
  """Control (b)'s test results: training images -> {(attention, seed): test accuracy at the
  validation-selected step}, the grid's runs at GRID_IMAGES."""
  return {images: _test_results(where, runs)
          for images, (where, runs) in _size_groups(archive).items()}


def size_rises(archive: pathlib.Path) -> dict[int, dict[tuple[str, int], float]]:
  """Control (b)'s validation-loss rises (`loss_rise`), keyed as `size_curves`; archived runs
  that did not diverge only."""
  rises = {}
  for images, (where, runs) in _size_groups(archive).items():
    found = {(r.args["attention"], r.args["seed"]): loss_rise(where / "runs" / r.run_id)
             for r in runs}
    rises[images] = {key: rise.rise for key, rise in found.items()
                     if rise is not None and math.isfinite(rise.rise)}
  return rises


def _sizes_lines(archive: pathlib.Path, curves: Mapping[int, Mapping[tuple[str, int], float]],
                 rises: Mapping[int, Mapping[tuple[str, int], float]]) -> list[str]:
  """Control (b)'s table and verdict from `size_curves` and `size_rises`."""
  lines = ["", "## Control (b): the training-set size at L = 49", "",
           "Test accuracy (%) at the validation-selected step, seed means; relu/L (alpha 1) - "
           "softmax paired by seed (SE); and, as description beside the rule, the validation "
           "loss's rise at the end above its minimum (seed means), as in control (a). The "
           f"grid's recipe at every size (40 epochs); {GRID_IMAGES:,} is the grid's own runs.",
           "", "| training images | runs | softmax | relu/L | relu/L - softmax | rise, softmax "
           "| rise, relu/L |", "|---|---|---|---|---|---|---|"]
  for images, found in sorted(curves.items()):
    cells = []
    for attention in ("softmax", "relu"):
      values = [found[attention, s] for s in al.SEEDS if (attention, s) in found]
      cells.append(f"{100 * np.mean(values):.2f}" if values else "-")
    paired = [s for s in al.SEEDS if ("relu", s) in found and ("softmax", s) in found]
    test = al.paired_test([found["relu", s] for s in paired],
                          [found["softmax", s] for s in paired]) if len(paired) > 1 else None
    cells.append("-" if test is None else f"{100 * test.mean:+.2f} ({100 * test.se:.2f})")
    for attention in ("softmax", "relu"):
      values = [rise for (arm, _), rise in rises[images].items() if arm == attention]
      cells.append(f"{np.mean(values):+.4f}" if values else "-")
    lines.append(f"| {images:,} | {len(found)} of 6 | " + " | ".join(cells) + " |")
  diverged = [r.run_id for r in size_runs()
               if (archive / "runs" / r.run_id / run_status.DIVERGED_FILE).exists()]
  if diverged:  # a missing point: the seed's slope does not exist
    return lines + ["", f"The slope: none, so **not shown parallel**: {', '.join(diverged)} "
                    "diverged."]
  if any(len(found) < 2 * len(al.SEEDS) for found in curves.values()):
    return lines + ["", "The slope: not yet (every size's 6 runs must be archived)."]
  sizes = sorted(curves)
  test = parallel_test(sizes, *([[curves[n][a, s] for n in sizes] for s in al.SEEDS]
                                for a in ("relu", "softmax")))
  trend = ("; relu/L's lead grows with the images" if test.lower > 0 else
           "; relu/L's lead shrinks with the images" if test.upper < 0 else "")
  return lines + ["", f"The slope of relu/L - softmax on log2(images): {100 * test.mean:+.2f} "
                  f"points per doubling (SE {100 * test.se:.2f}; 90% [{100 * test.lower:+.2f}, "
                  f"{100 * test.upper:+.2f}]): **"
                  + ("parallel" if test.equivalent else "not shown parallel")
                  + f"** (the rule: inside +-{100 * PARALLEL_MARGIN:g} points per doubling)"
                  + trend + "."]


def size_baselines(archive: pathlib.Path) -> dict[int, dict[str, float] | None]:
  """Control (b)'s trivial baselines (`al.trivial_baselines`), each fitted on the size's own
  training images: training images -> `<archive>/baselines/n<images>.json`, the grid's p4.json
  at GRID_IMAGES; None where not computed."""
  paths = {images: archive / "baselines" / f"n{images}.json" for images in SIZES}
  paths[GRID_IMAGES] = grid_archive(archive) / "baselines" / f"p{PATCH}.json"
  return {images: al.trivial_baselines(json.loads(path.read_text())) if path.exists() else None
          for images, path in paths.items()}


def _size_baselines_lines(baselines: Mapping[int, Mapping[str, float] | None]) -> list[str]:
  lines = ["", "Trivial baselines at each size, on the same training images and test split "
           "(test accuracy, %): raw pixels and the random-init ViT (seed mean of 3 networks) "
           "through 1-NN and ridge (`experiments.baselines --config "
           f"{al.CONFIG}:patch={PATCH},validation={al.VALIDATION},train_images=N`).", "",
           "| training images | pixel 1-NN | pixel ridge | random ViT 1-NN | random ViT ridge |",
           "|---|---|---|---|---|"]
  for images, found in sorted(baselines.items()):
    cells = (["not computed"] * 4 if found is None else
             [f"{100 * found[f'test/{key}']:.2f}"
              for key in ("pixel_1nn", "pixel_ridge", "random_1nn", "random_ridge")])
    lines.append(f"| {images:,} | " + " | ".join(cells) + " |")
  return lines


ARMS = (("softmax", "softmax"), ("relu", "relu/L (alpha 1)"))


def plot_sizes(curves: Mapping[int, Mapping[tuple[str, int], float]]) -> Figure:
  """Control (b) (`size_curves`): left, each arm's test accuracy against the training images
  (seed means, bars +- 1 SE); right, relu/L - softmax per seed (thin) and its seed mean (bold,
  over the sizes where all seeds are paired), the quantity whose slope the rule reads."""
  # Imported here: this module is also the plan, which the study core loads without matplotlib.
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  figure = Figure(figsize=(9, 3.6), layout="constrained")
  FigureCanvasAgg(figure)
  accuracy, lead = figure.subplots(1, 2)
  sizes = sorted(curves)
  for arm, label in ARMS:
    points = [(n, [100 * curves[n][arm, s] for s in al.SEEDS if (arm, s) in curves[n]])
              for n in sizes]
    points = [(n, v) for n, v in points if v]
    accuracy.errorbar([n for n, _ in points], [np.mean(v) for _, v in points],
                      yerr=[np.std(v, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0
                            for _, v in points], fmt="o-", capsize=3, label=label)
  paired = {s: {n: 100 * (curves[n]["relu", s] - curves[n]["softmax", s]) for n in sizes
                if ("relu", s) in curves[n] and ("softmax", s) in curves[n]} for s in al.SEEDS}
  for seed, lead_at in paired.items():
    lead.plot(list(lead_at), list(lead_at.values()), ".-", color="tab:gray", linewidth=0.8,
              label="per seed" if seed == al.SEEDS[0] else None)
  full = [n for n in sizes if all(n in lead_at for lead_at in paired.values())]
  lead.plot(full, [np.mean([lead_at[n] for lead_at in paired.values()]) for n in full],
            "o-", color="black", linewidth=2, label="seed mean")
  lead.axhline(0, color="tab:red", linestyle=":", linewidth=1)
  for ax, ylabel in ((accuracy, "test accuracy (%)"), (lead, "relu/L - softmax (points)")):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
    ax.minorticks_off()
    ax.set_xlabel("training images (L = 49, 40 epochs)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
  accuracy.set_title("test at the validation-selected step")
  lead.set_title("paired by seed")
  return figure


def _arms_lines(archive: pathlib.Path, name: str) -> list[str]:
  """Each arm under the grid's recipe and under the chosen regulariser `name`, seed means
  (description beside the rule; every run of both comparisons archived, none diverged)."""
  recipes = {"the grid": (grid_archive(archive), grid_comparison_runs()),
             name: (archive, comparison_runs(name))}
  tests = {recipe: _test_results(where, runs) for recipe, (where, runs) in recipes.items()}
  rises = {recipe: {(r.args["attention"], r.args["seed"]): loss_rise(where / "runs" / r.run_id).rise
                    for r in runs} for recipe, (where, runs) in recipes.items()}
  lines = ["", f"Each arm under the grid's recipe and under {name} (description, not a rule): "
           "test accuracy (%) at the validation-selected step and the validation loss's rise "
           f"at the end above its minimum, seed means; {name} - the grid paired by seed (SE).",
           "", f"| arm | the grid | {name} | {name} - the grid | rise, the grid | rise, {name} |",
           "|---|---|---|---|---|---|"]
  for arm, label in ARMS:
    grid, regularised = ([found[arm, s] for s in al.SEEDS] for found in tests.values())
    gain = al.paired_test(regularised, grid)
    lines.append(f"| {label} | {100 * np.mean(grid):.2f} | {100 * np.mean(regularised):.2f} | "
                 f"{100 * gain.mean:+.2f} ({100 * gain.se:.2f}) | "
                 + " | ".join(f"{np.mean([r[arm, s] for s in al.SEEDS]):+.4f}"
                              for r in rises.values()) + " |")
  return lines


def _paired_line(label: str, test: al.PairedTest | None) -> str:
  if test is None:
    return f"- {label}: not all of its 6 runs archived"
  return (f"- {label}: {100 * test.mean:+.2f} points (SE {100 * test.se:.2f}; 90% "
          f"[{100 * test.lower:+.2f}, {100 * test.upper:+.2f}]): {test.verdict}")


def compute_line(archive: pathlib.Path) -> str:
  """The compute this plan's archived runs spent (each run's last `core_hours`); the grid's
  runs that control (b) reuses are the grid report's."""
  hours = [run_status.core_hours(metrics_lib.read_metrics(jsonl.parent))
           for jsonl in sorted((archive / "runs").glob("*/" + metrics_lib.JSONL_NAME))]
  return (f"The controls' compute: {len(hours)} archived runs, {sum(hours):.1f} core hours "
          f"(the grid's {2 * len(al.SEEDS)} runs at {GRID_IMAGES:,} images that control (b) "
          "reuses are counted in results.md).")


def write(archive: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  """Writes controls.md into `out` (PLAN.report); returns its path."""
  unregularised = loss_rise(grid_archive(archive) / "runs" / grid_softmax_run().run_id)
  choice = choose(candidate_rises(archive))
  lines = ["# The alpha-length study's controls at L = 49", "", compute_line(archive), "",
           "## Control (a): regularisation", "",
           f"Redrawn from `{archive}` by `bash launch/study.sh alpha_length_controls report`; "
           "the rules: docs/alpha_length.md sections 5 and 7. Validation loss of seed-0 softmax "
           f"runs; a regulariser suffices when the loss at the end is within {LOSS_RISE} of "
           "its minimum.", "",
           "| candidate | arguments | min val loss | last | rise | meets |",
           "|---|---|---|---|---|---|"]
  for name, rise in (("none (the grid's)", unregularised), *choice.rises.items()):
    args = ", ".join(f"{k}={v}" for k, v in CANDIDATES.get(name, {}).items()) or "-"
    cells = ("not archived", "", "", "") if rise is None else (
        f"{rise.minimum:.4f}", f"{rise.last:.4f}", f"{rise.rise:+.4f}",
        "yes" if rise.meets else "no")
    lines.append(f"| {name} | {args} | " + " | ".join(cells) + " |")
  lines.append("")
  if unregularised is not None and unregularised.meets:
    lines.append("**Moot**: the grid's own softmax run meets the criterion; nothing trains.")
  elif choice.name is None:
    lines.append("The choice: not yet (a candidate before the first that meets the criterion "
                 "is not archived).")
  else:
    lines.append(f"The choice: **{choice.name}**"
                 + ("" if choice.meets else " (none meets the criterion: the smallest rise)"))
    grid = comparison(grid_archive(archive), grid_comparison_runs())
    regularised = comparison(archive, comparison_runs(choice.name))
    lines += ["", "relu/L (alpha 1) - softmax, test results at the validation-selected step, "
              "paired by seed (margin 1 point):", "",
              _paired_line(f"the grid (weight decay {BASE_WD:g}, no crop)", grid),
              _paired_line(f"under {choice.name}", regularised)]
    if grid is not None and regularised is not None:
      survives = "survives" if regularised.verdict == grid.verdict else "does not survive"
      lines += ["", f"**The grid's verdict ({grid.verdict}) {survives} regularisation** "
                f"(under {choice.name}: {regularised.verdict})."]
      lines += _arms_lines(archive, choice.name)
  curves = size_curves(archive)
  lines += (_sizes_lines(archive, curves, size_rises(archive))
            + _size_baselines_lines(size_baselines(archive))) + [
      "", "![control (b): accuracy and relu/L - softmax against the training images](sizes.png)"]
  out.mkdir(parents=True, exist_ok=True)
  plot_sizes(curves).savefig(out / "sizes.png", dpi=110)
  path = out / "controls.md"
  path.write_text("\n".join(lines) + "\n")
  return path
