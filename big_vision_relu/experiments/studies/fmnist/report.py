r"""The Fashion-MNIST study's verdicts: every result beside its baselines, the recipe's
convergence, and the claims judged by the decision rules of docs/reproduction.md (1.2), which
`rules` states on numbers alone.

    python -m big_vision_relu.experiments.studies.fmnist.report --archive results/fmnist \
        --out docs/fmnist
    bash launch/study.sh fmnist report      # this and the four figures' tables

Reads the archive (`<archive>/runs/<run id>/metrics.jsonl`, `provenance.json`) and the
baselines (`<archive>/baselines/p{2,4}.json`, from big_vision_relu.experiments.baselines); writes
`<out>/verdicts.md` and `<out>/curves.png` (test accuracy along training, phase A and the
calibration runs, with the pixel baselines).
"""
from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from absl import app, flags

from big_vision_relu.experiments import baseline_scores, provenance, stats, study_cost
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.studies.fmnist import recipe as fmnist_recipe
from big_vision_relu.experiments.studies.fmnist import rules as rules_lib
from big_vision_relu.experiments.studies.fmnist.results import (RunResult, by_seed, load_results,
                                                                pct, runs_by_seed, table)

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402  (after choosing the headless backend)

NOT_ACCEPTED_EXIT_CODE = 3  # --check_calibration: the recipe is not accepted (yet)


def _beats(value: float | None, threshold: float | None) -> str:
  if value is None or threshold is None:
    return "-"
  return "yes" if value > threshold else "**no**"


def _random_init_transfer(base: Mapping[str, float]) -> float | None:
  """The mean over seeds of the random network's 10-shot average (None if not computed)."""
  return baseline_scores.random_init_mean(base, "fewshot/", "/10shot_avg")


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
    rows.append((r.run.run_id, pct(r.accuracy), pct(r.last_quarter_gain, True),
                 _beats(r.accuracy, base.get("test/pixel_1nn")),
                 _beats(r.accuracy, base.get("test/pixel_ridge")), pct(r.transfer),
                 _beats(r.transfer, base.get("fewshot/pixels/10shot_avg")),
                 _beats(r.transfer, _random_init_transfer(base)),
                 f"{r.core_hours:.2f}" if r.core_hours is not None else "-",
                 r.provenance.get("commit", "-")[:7], provenance.describe(r.starts)))
  return table(("run", "test acc %", "last quarter adds", "> pixel 1-NN", "> pixel ridge",
                "10-shot %", "> pixels", "> random init", "core hours", "commit",
                "CPU from step"), rows)


def baselines_table(baselines: Mapping[int, Mapping[str, float]]) -> list[str]:
  rows = []
  for patch, base in sorted(baselines.items()):
    seeds = sum(k.startswith("fewshot/random_init/") and k.endswith("/10shot_avg") for k in base)
    random_init = _random_init_transfer(base)
    rows.append((f"{patch} (L = {(28 // patch) ** 2})", pct(base.get("test/pixel_1nn")),
                 pct(base.get("test/pixel_ridge")), pct(base.get("fewshot/pixels/10shot_avg")),
                 f"{pct(random_init)} ({seeds} seeds)" if random_init is not None else "-"))
  return table(("patch", "pixel 1-NN test acc %", "pixel ridge test acc %",
                "10-shot: raw pixels %", "10-shot: random init network %"), rows)


def _arm(args: Mapping[str, Any]) -> str:
  """A short name of an arm, e.g. "relu2 a1 gated", "softmax S L=49", "relu a0 e40" (size, L
  and epochs only where they are not the main setting's)."""
  main, args = fmnist.run().args, fmnist.run(**args).args
  name = args["attention"] + ("" if args["attention"] == "softmax" else f" a{args['alpha']:g}")
  name += "" if args["qk_norm"] else " no-qk-LN"
  name += " gated" if args["gated"] else ""
  if (args["size"], args["patch"]) != (main["size"], main["patch"]):
    name += f" {args['size']} L={(28 // args['patch']) ** 2}"
  return name + ("" if args["epochs"] == main["epochs"] else f" e{args['epochs']}")


def phase_a_sigma(results: Sequence[RunResult]) -> float | None:
  """sigma of 1.2: the seed sd pooled over phase A's three arms (None until all have seeds
  0-2; the held-out seed is not one of them)."""
  arms = [{s: a for s, a in by_seed(results, **arm).items() if s in fmnist.SEEDS}
          for arm in fmnist.PHASE_A_ARMS]
  if any(len(arm) < len(fmnist.SEEDS) for arm in arms):
    return None
  return rules_lib.pooled_sd(arms)


def _judge(claim: fmnist.Claim, results: Sequence[RunResult],
           baselines: Mapping[int, Mapping[str, float]], noise: float | None) -> tuple[str, ...]:
  """(Delta, SE or noise, seeds, their runs' CPUs, verdict, seeds to decide) of one claim, as
  table cells."""
  arms = [runs_by_seed(results, **arm) for arm in (claim.a, claim.b)]
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
      *table(("claim", "Delta = A - B", "Delta (points)", "+-", "seeds", "CPUs", "verdict",
              "seeds to decide"), rows),
      f"- Paired rows (several seeds): mean Delta over seeds against m = {margin:g} point (a "
      "row that says m = 0: 'A is better than B') with 2 SE; with 3 seeds 2 SE is lenient (t "
      "with 2 degrees of freedom puts 95% at 4.3 SE). "
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
      "docs/reproduction.md 1.4).",
      f"- Every row is judged on runs of the recipe's {fmnist.EPOCHS} epochs unless it names "
      "another length: a statement about that much training (1.2, \"The recipe trained twice as "
      "long\").", ""]


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
    rows.append((_arm(args), str(len(values)), pct(mean), _beats(mean, pixels),
                 _beats(mean, random_init),
                 "-" if counts is None else "yes" if counts else "**no**"))
  return table(("arm", "seeds", "10-shot % (seed mean)", "> raw pixels", "> random init",
                "counts"), rows)


def held_out_lines(results: Sequence[RunResult]) -> list[str]:
  """Is the held-out seed inside its arm's seed spread (mean +- 2 sd of seeds 0-2)?"""
  arm = by_seed(results, attention="relu", alpha=1.0)
  held = arm.pop(fmnist.HELD_OUT_SEED, None)
  seeds = [arm[s] for s in fmnist.SEEDS if s in arm]
  if held is None or len(seeds) < len(fmnist.SEEDS):
    return ["Held-out seed (relu/L, seed 3): not yet measured.", ""]
  spread = stats.summarize(seeds)
  mean, sd = spread.mean, spread.std
  inside = rules_lib.inside_seed_spread(held, seeds)
  return [f"Held-out seed (relu/L, seed {fmnist.HELD_OUT_SEED}): {pct(held)}% against seeds "
          f"0-2's {pct(mean)} +- {100 * sd:.1f} (2 sd: {pct(mean - 2 * sd)} to "
          f"{pct(mean + 2 * sd)}): **{'inside' if inside else 'OUTSIDE'}** the seed spread.", ""]


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



def write(archive: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  """Writes `out`/verdicts.md and `out`/curves.png from the archive; returns the first (the
  study's `Plan.report`)."""
  results = load_results(archive)
  baselines = {}
  for patch in (2, 4):
    path = archive / "baselines" / f"p{patch}.json"
    if path.exists():
      baselines[patch] = json.loads(path.read_text())
  done = sum(r.status == "finished" for r in results)
  lines = [f"# Fashion-MNIST study: verdicts ({done} of {len(results)} runs finished)", "",
           "Generated by `python -m big_vision_relu.experiments.studies.fmnist.report` from the "
           "archive; the rules are docs/reproduction.md's 1.2.", "", "## Baselines", "",
           *baselines_table(baselines), "## Recipe calibration", "",
           *fmnist_recipe.calibration_lines(results), "## The recipe trained twice as long", "",
           *fmnist_recipe.twice_as_long_lines(results),
           f"## The {fmnist.CANDIDATE_EPOCHS}-epoch candidate trained twice as long", "",
           *fmnist_recipe.candidate_lines(results), "## Claims", "",
           *claims_table(results, baselines), *held_out_lines(results),
           "## 10-shot transfer by arm", "", *transfer_table(results, baselines),
           "## Compute by phase", "",
           "Core hours by the trainers' own count; what is left is an estimate "
           "(`experiments/study_cost.py` says how it is made).", "",
           *study_cost.table(archive, fmnist.SWEEPS, fmnist.PHASES, image_size=28, channels=1),
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
    print("\n".join(fmnist_recipe.calibration_lines(results)))
    sys.exit(0 if fmnist_recipe.calibration(results).accepted else NOT_ACCEPTED_EXIT_CODE)
  print(write(pathlib.Path(FLAGS.archive), pathlib.Path(FLAGS.out)))


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_string("archive", "results/fmnist", "The study's archive.")
  flags.DEFINE_string("out", "docs/fmnist", "Output directory.")
  flags.DEFINE_bool("check_calibration", False, "Only print rules (a)-(c) and exit 0 if the "
                    f"recipe is accepted, {NOT_ACCEPTED_EXIT_CODE} if not (yet).")
  app.run(main)
