"""Why L^-1? The best alpha as a function of the sequence length (docs/alpha_length.md).

The study's grid, run order and pre-registered analysis, fixed before its first run:

- runs: configs/study/fmnist_vit.py (the Fashion-MNIST study's Ti model, head dim 32) with a
  5,000-image validation split held out of training (`validation`), `test` and `val` evaluated
  at 21 points (`eval_points`), 40 epochs; relu with qk-LN at `ALPHAS[L]`, softmax, and the
  attention-off control (`attention='zero'`) at L = 16, 49 (and then 196), 3 seeds each;
- a run's result (`run_result`): the evaluation with the best val/prec@1 selects; its
  test/prec@1 is the run's test result (beside it the final one); the test split selects nothing;
- alpha*(L) (`alpha_star`): the vertex of the parabola through the seed-mean best val/prec@1 at
  the grid argmax and its two neighbours, or the grid edge (censored) when the argmax is one;
- its uncertainty (`bootstrap_slopes`): seeds resampled with replacement within each L (the
  same resample for every alpha of that L: a seed's runs share nothing but the seed number, but
  resampling them together keeps the grid's shape), B = BOOTSTRAP_SAMPLES;
- the decision (`decide`): the OLS slope b of alpha* on ln L, its CONFIDENCE percentile
  interval; H1 (alpha* does not move with L) predicts b = 0, H0 (one absolute scale L^-alpha*
  = c) predicts b0 = the slope of K / ln L with K fitted to the alpha* point estimates;
- relu/L (alpha 1) against softmax at each L (`paired_test`): seed-paired differences of test
  accuracy, non-inferiority at MARGIN (one-sided 95% t bound) and equivalence (TOST, 90% t
  interval inside +-MARGIN).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from big_vision_relu.experiments import baseline_scores
from big_vision_relu.experiments.sweep import Grid, Run

CONFIG = "configs/study/fmnist_vit.py"
SWEEP = "grid"  # its one sweep (`PLAN.sweeps`; configs/alpha_length/grid.py lists it)
PATCH_TO_LENGTH = {7: 16, 4: 49, 2: 196}  # 28 x 28 images: (28 / patch)^2 tokens, no class token
ALPHAS = {16: (0.0, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0), 49: (0.0, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0),
          # alpha 0 too: H0's predicted 0.74 must not sit at the grid's end (it would be censored)
          196: (0.0, 0.5, 1.0, 1.5, 2.0)}
CONTROLS = ("softmax", "zero")  # softmax; attention off (every weight 0: tokens never mix)
SEEDS = (0, 1, 2)
EPOCHS = 40
VALIDATION = 5000
EVAL_POINTS = 20
GRID = Grid(CONFIG, dict(size="Ti", patch=7, attention="relu", alpha=1.0, qk_norm=True,
                         gated=False, epochs=EPOCHS, validation=VALIDATION,
                         eval_points=EVAL_POINTS, seed=0))

VAL, TEST = "val/prec@1", "test/prec@1"
MARGIN = 0.01  # non-inferiority / equivalence margin: 1 point of accuracy
CONFIDENCE = 0.90  # the slope's bootstrap interval
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0


def cells(patch: int) -> list[dict[str, Any]]:
  """The run arguments (but the seed) of one length's grid: softmax, attention off, then relu
  at every alpha of ALPHAS."""
  length = PATCH_TO_LENGTH[patch]
  return ([dict(patch=patch, attention=a) for a in CONTROLS]
          + [dict(patch=patch, attention="relu", alpha=alpha) for alpha in ALPHAS[length]])


def runs(patch: int, seeds: Sequence[int] = SEEDS) -> list[Run]:
  """One length's runs, seed by seed (a seed's whole grid before the next seed's)."""
  return [GRID.run(**cell, seed=seed) for seed in seeds for cell in cells(patch)]


# (sweep, selection) in run order, as `plans.plan` reads them: L = 16, then 49, seed 0's
# grid first at each; L = 196 last (its runs cost ~4x a run at L = 49 each).
PHASES: tuple[tuple[str, dict[str, Any]], ...] = tuple(
    (SWEEP, {"patch": patch, "seed": seeds})
    for patch in (7, 4, 2) for seeds in ((0,), (1, 2)))


# ----------------------------------------------------------------------------- one run's result

@dataclasses.dataclass(frozen=True)
class RunResult:
  """A run's evaluations read the pre-registered way (`run_result`)."""
  val_best: float  # the best val/prec@1 over the evaluations
  step_best: int  # its step (the earliest, on ties)
  test_at_best: float  # test/prec@1 at that step: the run's test result
  test_final: float  # test/prec@1 at the last evaluation
  val_final: float  # val/prec@1 at the last evaluation (reported beside the rule, not used by it)
  evaluations: int


def run_result(rows: Sequence[Mapping[str, Any]]) -> RunResult:
  """The result of a run from its metrics.jsonl rows: the evaluation with the best val/prec@1
  (the earliest on ties) selects; test/prec@1 there is the result. Raises ValueError for a run
  without a step that logged both."""
  points = [(int(r["step"]), float(r[VAL]), float(r[TEST])) for r in rows
            if VAL in r and TEST in r]
  if not points:
    raise ValueError(f"No step logged both {VAL} and {TEST}.")
  best = max(points, key=lambda p: (p[1], -p[0]))
  return RunResult(val_best=best[1], step_best=best[0], test_at_best=best[2],
                   test_final=max(points)[2], val_final=max(points)[1],
                   evaluations=len(points))


# ----------------------------------------------------------------------------- alpha*(L)

@dataclasses.dataclass(frozen=True)
class AlphaStar:
  alpha: float
  censored: bool  # the grid argmax is an end of the grid: alpha* may lie beyond it


def grid_argmax(accuracy: Sequence[float]) -> int:
  """The index of the best grid point (the first on ties): the point alpha* is fitted around."""
  return int(np.argmax(np.asarray(accuracy, np.float64)))


def alpha_star(alphas: Sequence[float], accuracy: Sequence[float]) -> AlphaStar:
  """The vertex of the parabola through the best grid point and its two neighbours (clipped to
  their range), or the grid end when the best point is an end (censored). `accuracy`: the
  seed-mean best val/prec@1 at each of `alphas` (ascending)."""
  a, y = np.asarray(alphas, np.float64), np.asarray(accuracy, np.float64)
  if a.ndim != 1 or a.shape != y.shape or len(a) < 3 or np.any(np.diff(a) <= 0):
    raise ValueError(f"alpha_star needs >= 3 ascending alphas with one accuracy each, got "
                     f"{list(alphas)} and {list(accuracy)}.")
  k = grid_argmax(y)
  if k in (0, len(a) - 1):
    return AlphaStar(float(a[k]), censored=True)
  x, z = a[k - 1:k + 2], y[k - 1:k + 2]
  curvature, slope, _ = np.polyfit(x, z, 2)  # exact through three points
  vertex = -slope / (2 * curvature) if curvature < 0 else float(a[k])
  return AlphaStar(float(np.clip(vertex, x[0], x[2])), censored=False)


def slope(lengths: Sequence[int], alphas: Sequence[float]) -> float:
  """OLS slope of alpha* on ln L."""
  x = np.log(np.asarray(lengths, np.float64))
  y = np.asarray(alphas, np.float64)
  return float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))


def h0_slope(lengths: Sequence[int], alphas: Sequence[float]) -> float:
  """H0's slope: alpha*(L) = K / ln L (one absolute scale c = L^-alpha* = e^-K), K fitted to
  `alphas` by least squares, then its OLS slope on ln L at these lengths."""
  inv = 1 / np.log(np.asarray(lengths, np.float64))
  k = float(np.sum(inv * np.asarray(alphas, np.float64)) / np.sum(inv ** 2))
  return slope(lengths, k * inv)


Accuracies = Mapping[int, Mapping[float, Sequence[float]]]  # L -> alpha -> per-seed val_best


def alpha_stars(accuracies: Accuracies) -> dict[int, AlphaStar]:
  """alpha*(L) of the seed means, per length."""
  return {length: alpha_star(sorted(by_alpha),
                             [float(np.mean(by_alpha[a])) for a in sorted(by_alpha)])
          for length, by_alpha in accuracies.items()}


def bootstrap_slopes(accuracies: Accuracies, samples: int = BOOTSTRAP_SAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> np.ndarray:
  """The slope of alpha* on ln L over `samples` bootstrap resamples of the seeds (per length,
  with replacement; one resample for all alphas of a length). Every alpha of a length needs
  the same number of seeds."""
  rng = np.random.Generator(np.random.PCG64(seed))
  lengths = sorted(accuracies)
  tables = {}
  for length in lengths:
    by_alpha = accuracies[length]
    grid = sorted(by_alpha)
    table = np.asarray([by_alpha[a] for a in grid], np.float64)  # [alphas, seeds]
    tables[length] = (grid, table)
  slopes = np.empty(samples)
  for i in range(samples):
    stars = []
    for length in lengths:
      grid, table = tables[length]
      pick = rng.integers(0, table.shape[1], table.shape[1])
      stars.append(alpha_star(grid, table[:, pick].mean(1)).alpha)
    slopes[i] = slope(lengths, stars)
  return slopes


@dataclasses.dataclass(frozen=True)
class Decision:
  verdict: str  # "supports H1" | "supports H0" | "inconclusive"
  reason: str
  stars: dict[int, AlphaStar]
  slope: float
  interval: tuple[float, float]
  h0_slope: float


def decide(accuracies: Accuracies, samples: int = BOOTSTRAP_SAMPLES,
           seed: int = BOOTSTRAP_SEED) -> Decision:
  """The pre-registered rule: the CONFIDENCE bootstrap interval of the slope includes 0 and
  excludes H0's slope -> "supports H1"; includes H0's and excludes 0 -> "supports H0";
  otherwise, or when any alpha* is censored at a grid end, "inconclusive"."""
  stars = alpha_stars(accuracies)
  lengths = sorted(stars)
  point = slope(lengths, [stars[n].alpha for n in lengths])
  b0 = h0_slope(lengths, [stars[n].alpha for n in lengths])
  tail = 100 * (1 - CONFIDENCE) / 2
  low, high = (float(v) for v in np.percentile(bootstrap_slopes(accuracies, samples, seed),
                                               [tail, 100 - tail]))
  has = lambda v: low <= v <= high  # noqa: E731
  censored = [n for n in lengths if stars[n].censored]
  if censored:
    verdict, reason = "inconclusive", f"alpha* at a grid end at L = {censored}"
  elif has(0.0) and not has(b0):
    verdict, reason = "supports H1", "the interval includes 0 and excludes H0's slope"
  elif has(b0) and not has(0.0):
    verdict, reason = "supports H0", "the interval includes H0's slope and excludes 0"
  else:
    verdict = "inconclusive"
    reason = "the interval includes both slopes" if has(0.0) else "it includes neither slope"
  return Decision(verdict, reason, stars, point, (low, high), b0)


# ----------------------------------------------------------------------------- paired arms

# One-sided 95% and two-sided 90% t quantiles by degrees of freedom (the same number): scipy's
# t.ppf(0.95, df) for df = 1..10.
T_95 = {1: 6.3138, 2: 2.9200, 3: 2.3534, 4: 2.1318, 5: 2.0150, 6: 1.9432, 7: 1.8946, 8: 1.8595,
        9: 1.8331, 10: 1.8125}


@dataclasses.dataclass(frozen=True)
class PairedTest:
  mean: float  # mean of a - b over seeds
  se: float
  lower: float  # one-sided 95% lower bound (= the 90% interval's low end)
  upper: float
  non_inferior: bool  # lower > -margin
  equivalent: bool  # -margin < lower and upper < margin (TOST at 5% each side)
  superior: bool  # lower > 0

  @property
  def verdict(self) -> str:
    """The strongest of section 5's verdicts that holds."""
    return ("better" if self.superior else "equivalent" if self.equivalent else
            "non-inferior" if self.non_inferior else "not shown")


def paired_test(a: Sequence[float], b: Sequence[float], margin: float = MARGIN) -> PairedTest:
  """Seed-paired differences a - b (test accuracies of one seed each), judged at `margin`."""
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  if d.ndim != 1 or len(d) < 2 or len(d) - 1 not in T_95:
    raise ValueError(f"paired_test needs 2 to {max(T_95) + 1} seed pairs, got {len(d)}.")
  mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))
  lower, upper = mean - T_95[len(d) - 1] * se, mean + T_95[len(d) - 1] * se
  return PairedTest(mean, se, lower, upper, non_inferior=lower > -margin,
                    equivalent=-margin < lower and upper < margin, superior=lower > 0)


# ----------------------------------------------------------------------------- baselines

def trivial_baselines(found: Mapping[str, float]) -> dict[str, float]:
  """`experiments.baselines`' JSON -> what section 5 sets beside every result:
  `<split>/pixel_<probe>` and `<split>/random_<probe>` (the random networks' seed mean) for the
  splits val and test and the probes 1nn and ridge, and the 10-shot transfer averages
  `pixels_10shot` and `random_10shot`; nan where the JSON lacks one."""
  def random_mean(prefix: str, suffix: str) -> float:
    mean = baseline_scores.random_init_mean(found, prefix, suffix)
    return math.nan if mean is None else mean
  means = {f"{split}/{source}_{probe}": (
      found.get(f"{split}/pixel_{probe}", math.nan) if source == "pixel"
      else random_mean(f"{split}/", f"/{probe}"))
      for split in ("val", "test") for source in ("pixel", "random") for probe in ("1nn", "ridge")}
  return {**means, "pixels_10shot": found.get("fewshot/pixels/10shot_avg", math.nan),
          "random_10shot": random_mean("", "/10shot_avg")}


# ----------------------------------------------------------------------------- power

def simulate(true_stars: Mapping[int, float], *, curvature: float, noise: float,
             seeds: int = len(SEEDS), trials: int = 200, samples: int = 400,
             seed: int = 0) -> dict[str, float]:
  """How often `decide` returns each verdict when the truth at each length L is a parabola
  peaking at `true_stars[L]` with `curvature` (accuracy lost per unit alpha^2) and each run's
  best val accuracy has independent normal `noise` (sd): the rule's power."""
  rng = np.random.Generator(np.random.PCG64(seed))
  counts: dict[str, int] = {}
  for trial in range(trials):
    accuracies = {
        length: {a: list(0.9 - curvature * (a - star) ** 2 + noise * rng.standard_normal(seeds))
                 for a in ALPHAS[length]}
        for length, star in true_stars.items()}
    verdict = decide(accuracies, samples=samples, seed=trial).verdict
    counts[verdict] = counts.get(verdict, 0) + 1
  return {v: counts.get(v, 0) / trials for v in ("supports H1", "supports H0", "inconclusive")}
