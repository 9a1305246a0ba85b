"""The decision rules of the Fashion-MNIST study (docs/reproduction.md 1.2), on numbers alone.

A claim of the paper compares two arms by Delta = (the arm the paper favours) - (the other), in
accuracy. With seeds, Delta is a paired difference over seeds with its standard error
(`paired`, `verdict`); a single-seed difference is judged against the seed noise of phase A,
2 sqrt(2) sigma (`single_seed_noise`, `favours`, `little_effect`). An arm whose runs do not all
beat the raw-pixel baselines measures nothing (`measures_something`), whatever Delta says. A
held-out seed must land inside its arm's seed spread (`inside_seed_spread`).
`studies.fmnist.report` gathers the numbers from the archive and prints the verdicts.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from big_vision_relu.experiments import stats

MARGIN = 0.01  # m: one point of accuracy
HOLDS, DOES_NOT_HOLD, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
NOT_YET = "not yet measured"


@dataclasses.dataclass(frozen=True)
class Paired:
  """Mean and standard error of per-seed differences a_s - b_s over the seeds both have."""
  delta: float
  se: float
  seeds: tuple[int, ...]


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> Paired | None:
  """The paired comparison of two arms by seed (None with fewer than 2 common seeds: a single
  difference has no standard error)."""
  seeds = tuple(sorted(set(a) & set(b)))
  if len(seeds) < 2:
    return None
  d = np.array([a[s] - b[s] for s in seeds])
  return Paired(float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d))), seeds)


def verdict(comparison: Paired | None, margin: float = MARGIN) -> str:
  """"A is at most `margin` worse than B, or better": holds if Delta - 2 SE > -m, does not
  hold if Delta + 2 SE < -m, inconclusive otherwise."""
  if comparison is None:
    return NOT_YET
  if comparison.delta - 2 * comparison.se > -margin:
    return HOLDS
  if comparison.delta + 2 * comparison.se < -margin:
    return DOES_NOT_HOLD
  return INCONCLUSIVE


def seeds_to_decide(comparison: Paired, margin: float = MARGIN) -> int | None:
  """For an inconclusive comparison: the fewest seeds at which `verdict` would decide if the
  mean and the per-seed sd of the differences stayed as measured (None if Delta is exactly -m,
  where no number of seeds decides)."""
  gap = abs(comparison.delta + margin)  # Delta's distance to the boundary -m
  if gap == 0:
    return None
  sd = comparison.se * math.sqrt(len(comparison.seeds))
  return max(len(comparison.seeds), math.floor((2 * sd / gap) ** 2) + 1)


def pooled_sd(arms: Sequence[Mapping[int, float]]) -> float:
  """sigma: the seed standard deviation pooled over arms, sqrt(sum (n_i - 1) s_i^2 /
  sum (n_i - 1)); every arm needs >= 2 seeds."""
  if not arms or any(len(arm) < 2 for arm in arms):
    raise ValueError("pooled_sd needs at least two seeds in every arm.")
  summaries = [stats.summarize(list(arm.values())) for arm in arms]
  return math.sqrt(sum((x.n - 1) * x.std ** 2 for x in summaries) /
                   sum(x.n - 1 for x in summaries))


def single_seed_noise(sigma: float) -> float:
  """Two standard deviations of a difference of two single-seed runs: 2 sqrt(2) sigma."""
  return 2 * math.sqrt(2) * sigma


def favours(delta: float, noise: float) -> str:
  """A single-seed "A is better than B": holds if Delta > noise, does not hold if
  Delta < -noise (B better beyond noise), inconclusive (within noise) otherwise."""
  if delta > noise:
    return HOLDS
  if delta < -noise:
    return DOES_NOT_HOLD
  return INCONCLUSIVE


def little_effect(delta: float, noise: float, margin: float = MARGIN) -> str:
  """A single-seed "A and B differ little": holds if |Delta| < m or |Delta| is within the
  noise (a difference counts only beyond it); does not hold otherwise."""
  return HOLDS if abs(delta) < margin or abs(delta) <= noise else DOES_NOT_HOLD


def inside_seed_spread(held_out: float, seeds: Sequence[float]) -> bool:
  """The held-out seed's check: within the other seeds' mean +- 2 sd (ddof 1)."""
  spread = stats.summarize(seeds)
  return abs(held_out - spread.mean) <= 2 * spread.std


def measures_something(accuracies: Sequence[float], pixel_1nn: float,
                       pixel_ridge: float) -> bool:
  """An arm measures something only if every one of its runs beats both raw-pixel baselines."""
  return all(a > pixel_1nn and a > pixel_ridge for a in accuracies)
