r"""The Fashion-MNIST study's verdicts: every result beside its baselines, the recipe's
convergence, and the claims judged by the decision rules of docs/reproduction.md (1.2), which
`experiments.decision_rules` states on numbers alone.

    python -m big_vision_relu.experiments.fmnist_report --archive results/fmnist --out docs/fmnist
    bash launch/study.sh fmnist report      # this and the four figures' tables

Reads the archive (`<archive>/runs/<run id>/metrics.jsonl`, `provenance.json`) and the
baselines (`<archive>/baselines/p{2,4}.json`, from big_vision_relu.experiments.baselines); writes
`<out>/verdicts.md` and `<out>/curves.png` (test accuracy along training, phase A and the
calibration runs, with the pixel baselines).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from absl import app, flags

from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import decision_rules as rules_lib
from big_vision_relu.experiments import fmnist, provenance, run_status, stats, study, study_cost
from big_vision_relu.experiments import sweep as sweep_lib

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402  (after choosing the headless backend)

ACCURACY = "test/prec@1"
TRANSFER = "fewshot/10shot_avg"
LAST_QUARTER_MAX_GAIN = 0.005  # recipe rule (b)
DOUBLE_LENGTH_MAX_GAIN = 0.01  # recipe rule (c)
SOFTMAX_MIN_ACCURACY = 0.89  # recipe rule (a)
NOT_ACCEPTED_EXIT_CODE = 3  # --check_calibration: the recipe is not accepted (yet)


@dataclasses.dataclass(frozen=True)
class RunResult:
  """One archived run: its final metrics, its test-accuracy curve and where it was trained."""
  run: sweep_lib.Run
  status: str
  curve: dict[int, float]  # step -> test accuracy (steps > 1)
  total_steps: int | None
  transfer: float | None
  core_hours: float | None
  provenance: dict[str, Any]
  starts: provenance.Starts = ()  # the CPU of each start (`provenance.starts`)

  @property
  def accuracy(self) -> float | None:
    return self.curve[max(self.curve)] if self.status == "finished" and self.curve else None

  def accuracy_at(self, fraction: float) -> float | None:
    """Test accuracy at the evaluation nearest to `fraction` of the run (the earlier on a tie).
    Nearest, not "at or before": a `log_percent` schedule evaluates every ceil(p T) steps, so
    its 75% evaluation of a 9,375-step run is at step 7,032, just after 0.75 T = 7,031.25."""
    if self.total_steps is None or not self.curve:
      return None
    target = fraction * self.total_steps
    return self.curve[min(self.curve, key=lambda s: (abs(s - target), s))]

  @property
  def last_quarter_gain(self) -> float | None:
    """What the last quarter of training added (recipe rule (b)): the final test accuracy less
    that at 75% of the run; None for a run not finished."""
    at_75 = self.accuracy_at(0.75) if self.accuracy is not None else None
    return None if at_75 is None else self.accuracy - at_75


def load_run(archive: pathlib.Path, run: sweep_lib.Run) -> RunResult:
  directory = study.archived_dir(archive, run)
  row = run_status.collect_run(run, directory)
  records: dict[int, dict[str, Any]] = {}
  if (directory / "metrics.jsonl").exists():
    records = metrics_lib.read_metrics(directory)
  curve = {s: r[ACCURACY] for s, r in sorted(records.items()) if s > 1 and ACCURACY in r}
  values = run_status.last_values({s: r for s, r in records.items() if s > 1},
                              (TRANSFER, "core_hours"))
  return RunResult(run, row.status, curve, row.total_steps, values.get(TRANSFER),
                   values.get("core_hours"), provenance.read_provenance(directory),
                   provenance.starts(directory))


def _runs_by_seed(results: Sequence[RunResult], **args: Any) -> dict[int, RunResult]:
  """{seed: run} of the finished runs whose args match `args`."""
  want = fmnist.run(**args).args
  return {r.run.args["seed"]: r for r in results if r.accuracy is not None and all(
      r.run.args[k] == v for k, v in want.items() if k != "seed")}


def _by_seed(results: Sequence[RunResult], **args: Any) -> dict[int, float]:
  """{seed: final test accuracy} of the finished runs whose args match `args`."""
  return {seed: r.accuracy for seed, r in _runs_by_seed(results, **args).items()}


def _pct(value: float | None, signed: bool = False) -> str:
  if value is None:
    return "-"
  return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
          *("| " + " | ".join(row) + " |" for row in rows), ""]


def _beats(value: float | None, threshold: float | None) -> str:
  if value is None or threshold is None:
    return "-"
  return "yes" if value > threshold else "**no**"


def _random_init_transfer(base: Mapping[str, float]) -> float | None:
  """The mean over seeds of the random network's 10-shot average (None if not computed)."""
  values = [v for k, v in base.items()
            if k.startswith("fewshot/random_init/") and k.endswith("/10shot_avg")]
  return float(np.mean(values)) if values else None


def runs_table(results: Sequence[RunResult], baselines: Mapping[int, Mapping[str, float]]
               ) -> list[str]:
  """Every finished run beside its patch's baselines: does it beat the pixel 1-NN and ridge
  (accuracy), raw pixels and the random network (transfer)? And what its last quarter of
  training added (rule (b)'s measure of convergence, applied to every run)."""
  rows = []
  for r in results:
    if r.status != "finished":
      continue
    base = baselines.get(r.run.args["patch"], {})
    rows.append((r.run.run_id, _pct(r.accuracy), _pct(r.last_quarter_gain, True),
                 _beats(r.accuracy, base.get("test/pixel_1nn")),
                 _beats(r.accuracy, base.get("test/pixel_ridge")), _pct(r.transfer),
                 _beats(r.transfer, base.get("fewshot/pixels/10shot_avg")),
                 _beats(r.transfer, _random_init_transfer(base)),
                 f"{r.core_hours:.2f}" if r.core_hours is not None else "-",
                 r.provenance.get("commit", "-")[:7], provenance.describe(r.starts)))
  return _table(("run", "test acc %", "last quarter adds", "> pixel 1-NN", "> pixel ridge",
                 "10-shot %", "> pixels", "> random init", "core hours", "commit",
                 "CPU from step"), rows)


def baselines_table(baselines: Mapping[int, Mapping[str, float]]) -> list[str]:
  rows = []
  for patch, base in sorted(baselines.items()):
    seeds = sum(k.startswith("fewshot/random_init/") and k.endswith("/10shot_avg") for k in base)
    random_init = _random_init_transfer(base)
    rows.append((f"{patch} (L = {(28 // patch) ** 2})", _pct(base.get("test/pixel_1nn")),
                 _pct(base.get("test/pixel_ridge")), _pct(base.get("fewshot/pixels/10shot_avg")),
                 f"{_pct(random_init)} ({seeds} seeds)" if random_init is not None else "-"))
  return _table(("patch", "pixel 1-NN test acc %", "pixel ridge test acc %",
                 "10-shot: raw pixels %", "10-shot: random init network %"), rows)


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
      rows.append((attention, str(point[0]), f"{point[1]:g}", _pct(acc),
                   _pct(last_quarter[point, attention], True)))
  short, long, other_lr = fmnist.CALIBRATION

  def converged(point: Point) -> bool | None:  # rule (b)
    gain = last_quarter[point, "softmax"]
    return None if gain is None else gain < LAST_QUARTER_MAX_GAIN

  a = (None if accuracy[long, "softmax"] is None
       else accuracy[long, "softmax"] >= SOFTMAX_MIN_ACCURACY)
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
              f"({_pct(accuracy[higher, 'softmax'])} vs {_pct(accuracy[lower, 'softmax'])}), "
              f"whose last quarter {'meets' if converged(higher) else 'does NOT meet'} (b)")
  if choice is not None:
    meets = accuracy[choice, "softmax"] >= SOFTMAX_MIN_ACCURACY
    reason += (f"; its softmax {'meets' if meets else 'does NOT meet'} (a) and its last quarter "
               f"{'meets' if converged(choice) else 'does NOT meet'} (b)")
  return Calibration(a=a, b=b, c=c, choice=choice, reason=reason, rows=tuple(rows))


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
      *_table(("attention (seed 0, L = 196)", "epochs", "peak lr", "test acc %",
               "last quarter adds"), rules.rows),
      f"- the study's recipe: {_point(recipe)}",
      f"- (a) softmax >= {100 * SOFTMAX_MIN_ACCURACY:.0f}% at {_point(long)}: {_rule(rules.a)}",
      f"- (b) softmax's last quarter adds < {100 * LAST_QUARTER_MAX_GAIN:.1f} points at "
      f"{_point(long)}: {_rule(rules.b)}",
      f"- (c) {long[0]} epochs gain < {100 * DOUBLE_LENGTH_MAX_GAIN:.0f} point over {short[0]} "
      f"for softmax and relu/L: {_rule(rules.c)}",
      "- the rules choose: " + (_point(rules.choice) if rules.choice else "not yet")
      + f" ({rules.reason})",
      f"- accepted: {accepted}",
      ""]


def twice_as_long_lines(results: Sequence[RunResult]) -> list[str]:
  """Rule (c) on the recipe itself (docs/reproduction.md 1.2, "The recipe trained twice as
  long"): phase A's seed-0 softmax and relu/L against their twins trained for 2 x EPOCHS; and
  rule E1 (whether 2 x EPOCHS is a candidate recipe) on the softmax twin's curve."""
  by_id = {r.run.run_id: r for r in results}
  final, gains, rows, twins = {}, [], [], {}
  for twin in fmnist.twice_as_long():
    attention = twin.args["attention"]
    recipe, long = (by_id.get(run.run_id) for run in (fmnist.run(attention=attention), twin))
    twins[attention] = long
    final[attention] = tuple(r.accuracy if r else None for r in (recipe, long))
    gains.append(None if None in final[attention] else final[attention][1] - final[attention][0])
    rows.append(("relu/L" if attention == "relu" else attention,
                 *(_pct(a) for a in final[attention]), _pct(gains[-1], True),
                 _pct(long.last_quarter_gain if long else None, True)))
  rule = None if None in gains else all(g < DOUBLE_LENGTH_MAX_GAIN for g in gains)
  softmax = twins["softmax"]
  candidate = None if softmax is None or softmax.last_quarter_gain is None else (
      softmax.accuracy >= SOFTMAX_MIN_ACCURACY
      and softmax.last_quarter_gain < LAST_QUARTER_MAX_GAIN)
  deltas = [None if None in (final["relu"][i], final["softmax"][i])
            else final["relu"][i] - final["softmax"][i] for i in (0, 1)]
  epochs = (fmnist.EPOCHS, 2 * fmnist.EPOCHS)
  return [
      *_table(("attention (seed 0, L = 196)", f"test acc % at {epochs[0]} epochs",
               f"at {epochs[1]} epochs", "gain", f"last quarter of the {epochs[1]} adds"), rows),
      f"- (c) on the recipe: {epochs[1]} epochs gain < {100 * DOUBLE_LENGTH_MAX_GAIN:.0f} point "
      f"over {epochs[0]} for softmax and relu/L: {_rule(rule)}",
      f"- relu/L - softmax (seed 0, one observation): {_pct(deltas[0], True)} points at "
      f"{epochs[0]} epochs, {_pct(deltas[1], True)} at {epochs[1]}",
      f"- E1: {epochs[1]} epochs is a candidate recipe (its softmax >= "
      f"{100 * SOFTMAX_MIN_ACCURACY:.0f}% and its last quarter adds < "
      f"{100 * LAST_QUARTER_MAX_GAIN:.1f} points): {_rule(candidate)}",
      ""]


def _arm(args: Mapping[str, Any]) -> str:
  """A short name of an arm, e.g. "relu2 a1 gated", "softmax S L=49" (size and L only where
  they are not the main setting's)."""
  main, args = fmnist.run().args, fmnist.run(**args).args
  name = args["attention"] + ("" if args["attention"] == "softmax" else f" a{args['alpha']:g}")
  name += "" if args["qk_norm"] else " no-qk-LN"
  name += " gated" if args["gated"] else ""
  if (args["size"], args["patch"]) != (main["size"], main["patch"]):
    name += f" {args['size']} L={(28 // args['patch']) ** 2}"
  return name


def phase_a_sigma(results: Sequence[RunResult]) -> float | None:
  """sigma of 1.2: the seed sd pooled over phase A's three arms (None until all have seeds
  0-2; the held-out seed is not one of them)."""
  arms = [{s: a for s, a in _by_seed(results, **arm).items() if s in fmnist.SEEDS}
          for arm in fmnist.PHASE_A_ARMS]
  if any(len(arm) < len(fmnist.SEEDS) for arm in arms):
    return None
  return rules_lib.pooled_sd(arms)


def _judge(claim: fmnist.Claim, results: Sequence[RunResult],
           baselines: Mapping[int, Mapping[str, float]], noise: float | None) -> tuple[str, ...]:
  """(Delta, SE or noise, seeds, their runs' CPUs, verdict, seeds to decide) of one claim, as
  table cells."""
  arms = [_runs_by_seed(results, **arm) for arm in (claim.a, claim.b)]
  a, b = ({seed: r.accuracy for seed, r in runs.items()} for runs in arms)
  if claim.rule == "paired":
    comparison = rules_lib.paired(a, b)
    if comparison is None:
      return ("-", "-", "-", "-", rules_lib.NOT_YET, "-")
    delta, spread, seeds = comparison.delta, f"{100 * comparison.se:.2f} (SE)", comparison.seeds
  else:
    if 0 not in a or 0 not in b or noise is None:
      return ("-", "-", "-", "-", rules_lib.NOT_YET, "-")
    delta, spread, seeds = a[0] - b[0], f"{100 * noise:.2f} (noise)", (0,)
  cpus = sorted({cpu for runs in arms for s in seeds for _, cpu in runs[s].starts})
  cells = (f"{100 * delta:+.2f}", spread, ", ".join(map(str, seeds)), ", ".join(cpus) or "-")
  base = baselines.get(fmnist.run(**claim.a).args["patch"], {})
  if "test/pixel_1nn" not in base or "test/pixel_ridge" not in base:
    return (*cells, f"{rules_lib.NOT_YET} (no pixel baselines)", "-")
  below = [_arm(args) for args, arm in ((claim.a, a), (claim.b, b))
           if not rules_lib.measures_something(list(arm.values()), base["test/pixel_1nn"],
                                               base["test/pixel_ridge"])]
  if below:
    return (*cells, f"not measured ({' and '.join(below)}: a run at or below a pixel "
            "baseline)", "-")
  if claim.rule == "paired":
    verdict = rules_lib.verdict(comparison, claim.margin)
    needed = (rules_lib.seeds_to_decide(comparison, claim.margin)
              if verdict == rules_lib.INCONCLUSIVE else None)
    if len(comparison.seeds) < len(fmnist.SEEDS):  # every paired arm plans fmnist.SEEDS
      verdict += f" (interim: {len(comparison.seeds)} of {len(fmnist.SEEDS)} seeds)"
    return (*cells, verdict, "-" if needed is None else str(needed))
  judge = rules_lib.favours if claim.rule == "favours" else rules_lib.little_effect
  return (*cells, judge(delta, noise), "-")


def claims_table(results: Sequence[RunResult],
                 baselines: Mapping[int, Mapping[str, float]]) -> list[str]:
  """Every claim of 1.2 with its verdict, and how the single-seed ones are judged."""
  sigma = phase_a_sigma(results)
  noise = None if sigma is None else rules_lib.single_seed_noise(sigma)
  rows = [(c.text, f"{_arm(c.a)} - {_arm(c.b)}", *_judge(c, results, baselines, noise))
          for c in fmnist.CLAIMS]
  margin = 100 * rules_lib.MARGIN
  return [
      *_table(("claim", "Delta = A - B", "Delta (points)", "+-", "seeds", "CPUs", "verdict",
               "seeds to decide"), rows),
      f"- Paired rows (several seeds): mean Delta over seeds against m = {margin:g} point (a "
      "row that says m = 0: 'A is better than B') with 2 SE; with 3 seeds 2 SE is lenient (t with 2 degrees of freedom puts 95% at 4.3 SE). "
      "Seeds to decide: how many seeds an inconclusive row would need if its mean and per-seed "
      "sd stayed as measured. A verdict on fewer seeds than planned is interim: with 2, 2 SE "
      "is very lenient (1 degree of freedom puts 95% at 12.7 SE).",
      "- Single-seed rows (seed 0): against the noise of one difference, 2 sqrt(2) sigma, sigma "
      "the seed sd pooled over phase A's three arms: "
      + ("phase A is not finished yet." if sigma is None else
         f"sigma = {100 * sigma:.2f} points, noise = {100 * noise:.2f} points."),
      "- A verdict is 'not measured' when an arm has a run that does not beat both raw-pixel "
      "baselines (1-NN and ridge), whatever Delta says.",
      "- CPUs: the CPU models that trained the row's runs (XLA:CPU's results differ between "
      "models at rounding level; '?': a start recorded before starts named their CPU; "
      "docs/reproduction.md 1.4).", ""]


def transfer_table(results: Sequence[RunResult],
                   baselines: Mapping[int, Mapping[str, float]]) -> list[str]:
  """Each arm's seed-mean 10-shot transfer (runs at the recipe); by 1.2 it counts only if it
  beats both raw pixels and the randomly initialised network through the same probe."""
  arms: dict[tuple[tuple[str, Any], ...], list[float]] = {}
  for r in results:
    args = r.run.args
    if r.transfer is not None and (args["epochs"], args["lr"]) == (fmnist.EPOCHS, fmnist.LR):
      arms.setdefault(tuple((k, v) for k, v in args.items() if k != "seed"), []).append(
          r.transfer)
  rows = []
  for key, values in arms.items():
    args, mean = dict(key), float(np.mean(values))
    base = baselines.get(args["patch"], {})
    pixels, random_init = base.get("fewshot/pixels/10shot_avg"), _random_init_transfer(base)
    counts = (None if pixels is None or random_init is None
              else mean > pixels and mean > random_init)
    rows.append((_arm(args), str(len(values)), _pct(mean), _beats(mean, pixels),
                 _beats(mean, random_init),
                 "-" if counts is None else "yes" if counts else "**no**"))
  return _table(("arm", "seeds", "10-shot % (seed mean)", "> raw pixels", "> random init",
                 "counts"), rows)


def held_out_lines(results: Sequence[RunResult]) -> list[str]:
  """Is the held-out seed inside its arm's seed spread (mean +- 2 sd of seeds 0-2)?"""
  arm = _by_seed(results, attention="relu", alpha=1.0)
  held = arm.pop(fmnist.HELD_OUT_SEED, None)
  seeds = [arm[s] for s in fmnist.SEEDS if s in arm]
  if held is None or len(seeds) < len(fmnist.SEEDS):
    return ["Held-out seed (relu/L, seed 3): not yet measured.", ""]
  spread = stats.summarize(seeds)
  mean, sd = spread.mean, spread.std
  inside = rules_lib.inside_seed_spread(held, seeds)
  return [f"Held-out seed (relu/L, seed {fmnist.HELD_OUT_SEED}): {_pct(held)}% against seeds "
          f"0-2's {_pct(mean)} +- {100 * sd:.1f} (2 sd: {_pct(mean - 2 * sd)} to "
          f"{_pct(mean + 2 * sd)}): **{'inside' if inside else 'OUTSIDE'}** the seed spread.", ""]


def curve_runs(results: Sequence[RunResult]) -> list[RunResult]:
  """The runs curves.png draws, those of phase A, the calibration and the held-out seed: its
  labels (attention, alpha, epochs, lr, seed) would repeat for the other phases' runs."""
  shown = {run.run_id for run in fmnist.phase_a() + fmnist.calibration() + fmnist.held_out()}
  return [r for r in results if r.run.run_id in shown and r.curve and r.total_steps]


def plot_curves(results: Sequence[RunResult], baselines: Mapping[int, Mapping[str, float]],
                path: pathlib.Path) -> None:
  """Test accuracy against epochs for `curve_runs`, with the pixel baselines."""
  figure, ax = plt.subplots(figsize=(7, 4.5))
  colors = {"softmax": "tab:blue", "relu": "tab:red"}
  for r in curve_runs(results):
    args = r.run.args
    epochs = [s / r.total_steps * args["epochs"] for s in r.curve]
    style = "-" if args["alpha"] == 1.0 or args["attention"] == "softmax" else ":"
    ax.plot(epochs, list(r.curve.values()), style, color=colors[args["attention"]],
            alpha=0.5 if (args["epochs"], args["lr"]) == (fmnist.EPOCHS, fmnist.LR) else 1.0,
            marker=".", label=f"{args['attention']} a{args['alpha']:g} e{args['epochs']} "
                              f"lr{args['lr']:g} s{args['seed']}")
  for key, style in (("test/pixel_1nn", "--"), ("test/pixel_ridge", "-.")):
    if key in baselines.get(2, {}):
      ax.axhline(baselines[2][key], color="grey", linestyle=style, label=key.split("/")[1])
  ax.set_xlabel("epoch")
  ax.set_ylabel("Fashion-MNIST test accuracy")
  ax.set_ylim(0.75, 0.95)
  ax.legend(fontsize=6, ncol=2)
  ax.grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def load_results(archive: pathlib.Path) -> list[RunResult]:
  """Every planned run's result (finished or not) from the archive."""
  return [load_run(archive, item.run) for item in study.plan(fmnist.PHASES)]


def write(archive: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  results = load_results(archive)
  baselines = {}
  for patch in (2, 4):
    path = archive / "baselines" / f"p{patch}.json"
    if path.exists():
      baselines[patch] = json.loads(path.read_text())
  done = sum(r.status == "finished" for r in results)
  lines = [f"# Fashion-MNIST study: verdicts ({done} of {len(results)} runs finished)", "",
           "Generated by `python -m big_vision_relu.experiments.fmnist_report` from the archive; "
           "the rules are docs/reproduction.md's 1.2.", "", "## Baselines", "",
           *baselines_table(baselines), "## Recipe calibration", "",
           *calibration_lines(results), "## The recipe trained twice as long", "",
           *twice_as_long_lines(results), "## Claims", "",
           *claims_table(results, baselines), *held_out_lines(results),
           "## 10-shot transfer by arm", "", *transfer_table(results, baselines),
           "## Compute by phase", "",
           "Core hours by the trainers' own count; what is left is an estimate "
           "(`experiments/study_cost.py` says how it is made).", "",
           *study_cost.table(archive, fmnist.PHASES, image_size=28, channels=1),
           "## Every finished run beside its baselines", "",
           *runs_table(results, baselines)]
  out.mkdir(parents=True, exist_ok=True)
  (out / "verdicts.md").write_text("\n".join(lines))
  plot_curves(results, baselines, out / "curves.png")
  return out / "verdicts.md"


def main(argv: Sequence[str]) -> None:
  del argv
  if FLAGS.check_calibration:
    results = load_results(pathlib.Path(FLAGS.archive))
    print("\n".join(calibration_lines(results)))
    sys.exit(0 if calibration(results).accepted else NOT_ACCEPTED_EXIT_CODE)
  print(write(pathlib.Path(FLAGS.archive), pathlib.Path(FLAGS.out)))


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_string("archive", "results/fmnist", "The study's archive.")
  flags.DEFINE_string("out", "docs/fmnist", "Output directory.")
  flags.DEFINE_bool("check_calibration", False, "Only print rules (a)-(c) and exit 0 if the "
                    f"recipe is accepted, {NOT_ACCEPTED_EXIT_CODE} if not (yet).")
  app.run(main)
