"""The recipe rules of docs/reproduction.md 1.2 measured on the study's archive: (a)-(c) on the
calibration runs and the choice of recipe (D1, else D2); (c) on the recipe itself, against its
twins trained twice as long; E1, whether twice as long is a candidate recipe; and E2's (c) on
that candidate, point 3 of issue #22."""
from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.studies.fmnist.results import RunResult, load_results, pct, table

SOFTMAX_MIN_ACCURACY = 0.89  # rule (a)
LAST_QUARTER_MAX_GAIN = 0.005  # rule (b)
DOUBLE_LENGTH_MAX_GAIN = 0.01  # rule (c)

Point = tuple[int, float]  # a calibration point: (epochs, peak lr)


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The recipe rules of docs/reproduction.md 1.2 on the archive's calibration runs (seed 0,
  L = 196): (a)-(c) on the length pair at `fmnist.BASE_LR`, each True (met), False (not met) or
  None (not yet measured); `choice`, the recipe that D1 or D2 picks (None until decided), with
  why; and the table of their numbers."""
  a: bool | None
  b: bool | None
  c: bool | None
  choice: Point | None
  reason: str
  rows: tuple[tuple[str, ...], ...]

  @property
  def accepted(self) -> bool:
    """The rules have chosen a recipe and it is the study's (`fmnist.EPOCHS`, `fmnist.LR`)."""
    return self.choice == (fmnist.EPOCHS, fmnist.LR)


def _meets_a(accuracy: float) -> bool:
  return accuracy >= SOFTMAX_MIN_ACCURACY


def _meets_b(last_quarter_gain: float) -> bool:
  return last_quarter_gain < LAST_QUARTER_MAX_GAIN


def _point(point: Point) -> str:
  return f"{point[0]} epochs, lr {point[1]:g}"


def calibration(results: Sequence[RunResult]) -> Calibration:
  """Rules (a)-(c) and the choice of recipe (D1, else D2), measured on the archive."""
  by_id = {r.run.run_id: r for r in results}
  accuracy, last_quarter, rows = {}, {}, []
  for point in fmnist.CALIBRATION:
    for attention in ("softmax", "relu"):
      result = by_id.get(fmnist.run(attention=attention, epochs=point[0], lr=point[1]).run_id)
      acc = accuracy[point, attention] = result.accuracy if result else None
      last_quarter[point, attention] = result.last_quarter_gain if result else None
      rows.append((attention, str(point[0]), f"{point[1]:g}", pct(acc),
                   pct(last_quarter[point, attention], True)))
  short, long, other_lr = fmnist.CALIBRATION

  def converged(point: Point) -> bool | None:  # rule (b)
    gain = last_quarter[point, "softmax"]
    return None if gain is None else _meets_b(gain)

  a = None if accuracy[long, "softmax"] is None else _meets_a(accuracy[long, "softmax"])
  gains = [None if None in (accuracy[long, x], accuracy[short, x])
           else accuracy[long, x] - accuracy[short, x] for x in ("softmax", "relu")]
  c = None if None in gains else all(g < DOUBLE_LENGTH_MAX_GAIN for g in gains)
  b = converged(long)
  if a and b and c:
    choice, reason = long, "D1: (a)-(c) met"
  elif None in (a, b, c):
    choice, reason = None, "(a)-(c) not yet measured"
  elif accuracy[other_lr, "softmax"] is None or last_quarter[other_lr, "softmax"] is None:
    choice, reason = None, f"D2: waiting for the pair at {_point(other_lr)}"
  else:
    higher, lower = sorted((long, other_lr), key=lambda p: accuracy[p, "softmax"], reverse=True)
    choice = higher if converged(higher) else lower
    reason = (f"D2: softmax scores higher at lr {higher[1]:g} "
              f"({pct(accuracy[higher, 'softmax'])} vs {pct(accuracy[lower, 'softmax'])}), "
              f"whose last quarter {'meets' if converged(higher) else 'does NOT meet'} (b)")
  if choice is not None:
    meets = _meets_a(accuracy[choice, "softmax"])
    reason += (f"; its softmax {'meets' if meets else 'does NOT meet'} (a) and its last quarter "
               f"{'meets' if converged(choice) else 'does NOT meet'} (b)")
  return Calibration(a=a, b=b, c=c, choice=choice, reason=reason, rows=tuple(rows))


def gate(archive: pathlib.Path) -> tuple[tuple[int, ...], str] | None:
  """The study's gate (`Plan.gate`): until rules (a)-(c) accept the recipe, only the
  calibration phases train (None once they have)."""
  rules = calibration(load_results(archive))
  if rules.accepted:
    return None
  return fmnist.CALIBRATION_PHASES, f"the recipe is not accepted (yet): {rules.reason}"


def _rule(ok: bool | None) -> str:
  return "not yet measured" if ok is None else "met" if ok else "NOT met"


def calibration_lines(results: Sequence[RunResult]) -> list[str]:
  """Rules (a)-(c) of the recipe and the rules' choice, each with its measured numbers."""
  rules = calibration(results)
  short, long, _ = fmnist.CALIBRATION
  recipe = (fmnist.EPOCHS, fmnist.LR)
  if rules.accepted:
    accepted = "yes"
  elif rules.choice is not None:
    accepted = (f"no: the rules choose {_point(rules.choice)}, but the study's recipe is "
                f"{_point(recipe)}: set fmnist.EPOCHS and fmnist.LR to the choice")
  else:
    accepted = (f"no: only phases {', '.join(map(str, fmnist.CALIBRATION_PHASES))} run "
                "(launch/study.sh) until the rules choose a recipe")
  return [
      *table(("attention (seed 0, L = 196)", "epochs", "peak lr", "test acc %",
              "last quarter adds"), rules.rows),
      f"- the study's recipe: {_point(recipe)}",
      f"- (a) softmax >= {100 * SOFTMAX_MIN_ACCURACY:.0f}% at {_point(long)}: "
      f"{_rule(rules.a)}",
      f"- (b) softmax's last quarter adds < {100 * LAST_QUARTER_MAX_GAIN:.1f} points at "
      f"{_point(long)}: {_rule(rules.b)}",
      f"- (c) {long[0]} epochs gain < {100 * DOUBLE_LENGTH_MAX_GAIN:.0f} point over {short[0]} "
      f"for softmax and relu/L: {_rule(rules.c)}",
      "- the rules choose: " + (_point(rules.choice) if rules.choice else "not yet")
      + f" ({rules.reason})",
      f"- accepted: {accepted}",
      ""]


@dataclasses.dataclass(frozen=True)
class Doubling:
  """Seed 0's softmax and relu/L at a length and at twice it (rule (c)): `final[attention]` is
  (accuracy at `epochs`, at 2 x `epochs`), None where not finished; `twins[attention]`, the
  longer run's result; `met`, whether both gain < 1 point (None until both twins finish)."""
  epochs: int
  final: dict[str, tuple[float | None, float | None]]
  twins: dict[str, RunResult | None]
  met: bool | None
  rows: tuple[tuple[str, ...], ...]


def doubling(results: Sequence[RunResult], epochs: int) -> Doubling:
  """Rule (c) on seed 0's pair at `epochs` (`fmnist.twice_as_long(epochs)`)."""
  by_id = {r.run.run_id: r for r in results}
  final, twins, gains, rows = {}, {}, [], []
  for twin in fmnist.twice_as_long(epochs):
    attention = twin.args["attention"]
    short = by_id.get(fmnist.run(attention=attention, epochs=epochs).run_id)
    long = twins[attention] = by_id.get(twin.run_id)
    final[attention] = tuple(r.accuracy if r else None for r in (short, long))
    gains.append(None if None in final[attention] else final[attention][1] - final[attention][0])
    rows.append(("relu/L" if attention == "relu" else attention,
                 *(pct(a) for a in final[attention]), pct(gains[-1], True),
                 pct(long.last_quarter_gain if long else None, True)))
  met = None if None in gains else all(g < DOUBLE_LENGTH_MAX_GAIN for g in gains)
  return Doubling(epochs, final, twins, met, tuple(rows))


def _doubling_lines(rules: Doubling, what: str) -> list[str]:
  """The pair's table, rule (c) on it (`what`: the recipe it checks), and relu/L - softmax."""
  epochs = (rules.epochs, 2 * rules.epochs)
  deltas = [None if None in (rules.final["relu"][i], rules.final["softmax"][i])
            else rules.final["relu"][i] - rules.final["softmax"][i] for i in (0, 1)]
  return [
      *table(("attention (seed 0, L = 196)", f"test acc % at {epochs[0]} epochs",
              f"at {epochs[1]} epochs", "gain", f"last quarter of the {epochs[1]} adds"),
             rules.rows),
      f"- (c) on {what}: {epochs[1]} epochs gain < {100 * DOUBLE_LENGTH_MAX_GAIN:.0f} point "
      f"over {epochs[0]} for softmax and relu/L: {_rule(rules.met)}",
      f"- relu/L - softmax (seed 0, one observation): {pct(deltas[0], True)} points at "
      f"{epochs[0]} epochs, {pct(deltas[1], True)} at {epochs[1]}"]


def candidate_met(results: Sequence[RunResult]) -> bool | None:
  """Rule E1: the recipe's softmax twin of twice its length reaches (a) and its last quarter
  adds < 0.5 points, (b) (None until that run finishes)."""
  softmax = doubling(results, fmnist.EPOCHS).twins["softmax"]
  if softmax is None or softmax.last_quarter_gain is None:
    return None
  return _meets_a(softmax.accuracy) and _meets_b(softmax.last_quarter_gain)


def twice_as_long_lines(results: Sequence[RunResult]) -> list[str]:
  """Rule (c) on the recipe itself (docs/reproduction.md 1.2, "The recipe trained twice as
  long"): phase A's seed-0 softmax and relu/L against their twins trained for 2 x EPOCHS; and
  rule E1 (whether 2 x EPOCHS is a candidate recipe) on the softmax twin's curve."""
  return [
      *_doubling_lines(doubling(results, fmnist.EPOCHS), "the recipe"),
      f"- E1: {fmnist.CANDIDATE_EPOCHS} epochs is a candidate recipe (its softmax >= "
      f"{100 * SOFTMAX_MIN_ACCURACY:.0f}% and its last quarter adds < "
      f"{100 * LAST_QUARTER_MAX_GAIN:.1f} points): {_rule(candidate_met(results))}",
      ""]


def candidate_lines(results: Sequence[RunResult]) -> list[str]:
  """Rule E2's (c) on the candidate recipe: its seed-0 pair against their twins of twice its
  length; point 3 of issue #22 is met iff the candidate meets E1 ((a) and (b)) and both gain
  < 1 point."""
  rules = doubling(results, fmnist.CANDIDATE_EPOCHS)
  checks = (candidate_met(results), rules.met)
  point_3 = False if False in checks else None if None in checks else True
  return [*_doubling_lines(rules, f"the {fmnist.CANDIDATE_EPOCHS}-epoch candidate"),
          "- point 3 (#22's definition of a converged recipe, E1 and this (c); one-sided: "
          f"an accuracy loss passes it): {_rule(point_3)}", ""]
