"""Statistics over a sweep's rows: runs grouped over seeds (mean, sample std, count), the order
of the figures' columns, and the gate's cost in core hours.

Seeds. Runs whose dataset and args agree except for `seed` form a group (`group_rows`; without a
`seed` argument each run is its own group). A group's `Stat` of a metric is the mean, the sample
standard deviation (ddof=1; None below 2 values) and the number of its runs that logged the
metric. A group is finished (or missing) when all its runs are, else running.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from big_vision_relu.experiments import recipes
from big_vision_relu.experiments.run_status import CORE_HOURS, Row

SEED = "seed"
GATED = "gated"


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


def has_seeds(rows: Sequence[Row]) -> bool:
  """Whether any run has a `seed` argument (then the reports add the seeds' statistics)."""
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


def ordered(values: Iterable[Any]) -> list[Any]:
  """`values` without repeats, in order of first appearance."""
  return list(dict.fromkeys(values))


def panel_values(items: Iterable[Row | Group], key: str) -> list[Any]:
  """The values of the args' `key` (the columns of Figures 2-4): the paper's alpha-sweep
  variants (S/32, S/16, S/8) first, the others in order of appearance."""
  present = ordered(item.args[key] for item in items)
  return ([v for v in recipes.ALPHA_SWEEP_VARIANTS if v in present]
          + [v for v in present if v not in recipes.ALPHA_SWEEP_VARIANTS])
