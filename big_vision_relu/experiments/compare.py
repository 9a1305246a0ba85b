r"""Is a difference between two sets of runs beyond seed noise? The numbers behind the verdicts
of docs/reproduction.md.

    python -m big_vision_relu.experiments.compare --sweep configs/repro/fig2.py \
        --root results/repro --a patch=2,attention=relu,alpha=1 --b patch=2,attention=softmax
    python -m big_vision_relu.experiments.compare --sweep configs/repro/fig3.py \
        --root results/repro --a patch=4,attention=relu,qk_norm=False \
        --b patch=4,attention=relu,qk_norm=True --paired_by alpha

`--a` and `--b` select the finished runs of the sweep whose args have those values (key=value,
comma-separated). Without `--paired_by`, each side must be one group of runs that differ only in
the seed; for the sweep's accuracy and few-shot metrics it prints each side's mean ± sample std
(n), the difference of the means (a - b), its standard error sqrt(s_a²/n_a + s_b²/n_b) (none
when a side has a single run) and the difference in SE units.

With `--paired_by KEY`, the runs of each side are split by the value of KEY (e.g. relu with and
without qk-LN, at each alpha); each value present on both sides gives a difference of means, and
it prints them, their mean, and how many have the sign of that mean (were each sign a coin
flip, all k would agree with probability 2^(1-k)).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from absl import app, flags

from big_vision_relu.experiments import run_status, stats
from big_vision_relu.experiments import sweep as sweep_lib


@dataclasses.dataclass(frozen=True)
class Difference:
  """a - b of one metric between two groups of runs."""
  a: stats.Stat
  b: stats.Stat
  diff: float  # mean of a - mean of b
  se: float | None  # sqrt(s_a²/n_a + s_b²/n_b); None when a side has fewer than 2 runs

  @property
  def in_se(self) -> float | None:
    return None if self.se is None or self.se == 0 else self.diff / self.se


def parse_selection(text: str) -> dict[str, str]:
  """'patch=2,attention=relu' -> {'patch': '2', 'attention': 'relu'}."""
  selection = {}
  for item in text.split(","):
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
      raise ValueError(f"Selection {text!r}: {item!r} is not key=value.")
    selection[key.strip()] = value.strip()
  return selection


def _matches(value: Any, text: str) -> bool:
  """Whether a run's arg `value` equals the command-line `text` (typed like the value)."""
  if isinstance(value, bool):
    if text.lower() not in ("true", "false"):
      raise ValueError(f"{text!r} is not a boolean (True or False).")
    return value == (text.lower() == "true")
  if isinstance(value, (int, float)):
    try:
      return float(text) == value
    except ValueError:
      raise ValueError(f"{text!r} is not a number.") from None
  return str(value) == text


def _check_known(rows: Sequence[run_status.Row], keys: Iterable[str]) -> None:
  known = {k for r in rows for k in r.args}
  unknown = sorted(set(keys) - known)
  if unknown:
    raise ValueError(f"Unknown run arguments {unknown}; the sweep's are {sorted(known)}.")


def select(rows: Sequence[run_status.Row], selection: Mapping[str, str]) -> list[run_status.Row]:
  """The finished rows whose args match every key=value of `selection`."""
  _check_known(rows, selection)
  return [r for r in rows if r.status == "finished"
          and all(k in r.args and _matches(r.args[k], v) for k, v in selection.items())]


def one_group(rows: Sequence[run_status.Row], what: str) -> stats.Group:
  """The single seed group of `rows`; a ValueError naming the args that vary otherwise."""
  if not rows:
    raise ValueError(f"{what}: no finished run matches.")
  groups = stats.group_rows(rows)
  if len(groups) > 1:
    varying = sorted({k for g in groups for k, v in g.args.items()
                      if v != groups[0].args.get(k)})
    raise ValueError(f"{what}: the runs also differ in {varying}, not only in the seed; "
                     "select a value for each (or pass --paired_by).")
  return groups[0]


def difference(a: Sequence[float], b: Sequence[float]) -> Difference:
  """a - b with its standard error (Welch's: the sides' variances are not assumed equal)."""
  stat_a, stat_b = stats.summarize(a), stats.summarize(b)
  if stat_a is None or stat_b is None:
    raise ValueError("Both sides need at least one value.")
  se = (None if stat_a.std is None or stat_b.std is None
        else math.sqrt(stat_a.std ** 2 / stat_a.n + stat_b.std ** 2 / stat_b.n))
  return Difference(stat_a, stat_b, stat_a.mean - stat_b.mean, se)


def compare(rows: Sequence[run_status.Row], a: Mapping[str, str], b: Mapping[str, str],
            metric: str) -> Difference:
  """`metric` of the seed group selected by `a` minus that of the one selected by `b`."""
  return difference(one_group(select(rows, a), f"--a {a}").values(metric),
                    one_group(select(rows, b), f"--b {b}").values(metric))


def compare_paired(rows: Sequence[run_status.Row], a: Mapping[str, str], b: Mapping[str, str],
                   metric: str, paired_by: str) -> dict[Any, Difference]:
  """{value of `paired_by`: a - b among the runs with that value}, for the values both sides
  have, in the order of the sweep."""
  if paired_by in a or paired_by in b:
    raise ValueError(f"--paired_by {paired_by} must not be selected by --a or --b.")
  _check_known(rows, [paired_by])
  rows_a, rows_b = select(rows, a), select(rows, b)
  values = [v for v in dict.fromkeys(r.args.get(paired_by) for r in rows_a)
            if any(r.args.get(paired_by) == v for r in rows_b)]
  if not values:
    raise ValueError(f"No value of {paired_by} has finished runs on both sides.")
  pairs = {}
  for value in values:
    group_a = one_group([r for r in rows_a if r.args.get(paired_by) == value],
                        f"--a {a}, {paired_by}={value}")
    group_b = one_group([r for r in rows_b if r.args.get(paired_by) == value],
                        f"--b {b}, {paired_by}={value}")
    pairs[value] = difference(group_a.values(metric), group_b.values(metric))
  return pairs


def _stat_text(stat: stats.Stat) -> str:
  spread = "" if stat.std is None else f" ± {stat.std:.4f}"
  return f"{stat.mean:.4f}{spread} ({stat.n})"


def describe(metric: str, d: Difference) -> str:
  se = "no SE (a side has one run)" if d.se is None else (
      f"SE {d.se:.4f}, {d.in_se:+.1f} SE" if d.in_se is not None else "SE 0")
  return f"{metric}: a {_stat_text(d.a)}, b {_stat_text(d.b)}; a - b {d.diff:+.4f}, {se}"


def describe_paired(metric: str, paired_by: str, pairs: Mapping[Any, Difference]) -> str:
  diffs = [d.diff for d in pairs.values()]
  mean = statistics.fmean(diffs)
  agree = sum(1 for x in diffs if x * mean > 0)
  per_value = ", ".join(f"{paired_by}={k}: {d.diff:+.4f}" for k, d in pairs.items())
  return (f"{metric}: a - b per {paired_by}: {per_value}; mean {mean:+.4f}, "
          f"{agree} of {len(diffs)} with its sign")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}.")
  spec = sweep_lib.load_figure_spec(FLAGS.sweep)
  rows = run_status.collect(FLAGS.sweep, FLAGS.root, spec)
  try:
    a, b = parse_selection(FLAGS.a), parse_selection(FLAGS.b)
    for metric in (spec.accuracy_metric, spec.fewshot_metric):
      if FLAGS.paired_by:
        print(describe_paired(metric, FLAGS.paired_by,
                              compare_paired(rows, a, b, metric, FLAGS.paired_by)))
      else:
        print(describe(metric, compare(rows, a, b, metric)))
  except ValueError as e:  # a selection that does not fit the sweep: say what, no traceback
    raise app.UsageError(str(e)) from None


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_string("sweep", None, "The sweep file (configs/repro/fig2.py).", required=True)
  flags.DEFINE_string("root", None, "The runs' root (results/repro).", required=True)
  flags.DEFINE_string("a", None, "key=value,... selecting side a.", required=True)
  flags.DEFINE_string("b", None, "key=value,... selecting side b.", required=True)
  flags.DEFINE_string("paired_by", None, "Pair the sides' runs by this argument (alpha).")
  app.run(main)
