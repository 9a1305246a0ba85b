r"""The numbers of "What the Fashion-MNIST study supports" (docs/reproduction.md), recomputed from
the study's archive (results/fmnist/runs/<run id>/metrics.jsonl, config.json) and its baselines:

    python tools/fmnist_reread.py [--archive results/fmnist]

Accuracies are test prec@1 at a run's last evaluation; "last quarter" is the final accuracy less
the one at the evaluation nearest 75% of the run (rule (b) as the report reads it); paired
differences are over seeds 0-2 with SE = sd / sqrt(3); sigma is the seed sd pooled over phase A's
three arms at 20 epochs and the single-seed noise 2 sqrt(2) sigma (docs/reproduction.md 1.2).
Reads only; seconds on one core.
"""
from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from big_vision_relu import metrics
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist

SEEDS = (0, 1, 2)
TRANSFER = "fewshot/10shot_avg"


class Archive:
  """The evaluations of archived runs, by `fmnist.run` arguments."""

  def __init__(self, root: pathlib.Path):
    self.root = root

  def evals(self, **args) -> dict[int, dict]:
    """{step: record} of the run's evaluations after step 1 (a resumed run's replayed steps:
    the later line wins, `metrics.read_metrics`)."""
    records = metrics.read_metrics(self.root / "runs" / fmnist.run(**args).run_id)
    return {s: r for s, r in records.items() if s > 1 and "test/prec@1" in r}

  def final(self, key="test/prec@1", **args) -> float:
    evals = self.evals(**args)
    return evals[max(evals)][key]

  def at(self, fraction: float, **args) -> float:
    """Test accuracy at the evaluation nearest `fraction` of the run (the earlier on a tie)."""
    evals = self.evals(**args)
    target = fraction * max(evals)
    return evals[min(evals, key=lambda s: (abs(s - target), s))]["test/prec@1"]

  def last_quarter(self, **args) -> float:
    return self.final(**args) - self.at(0.75, **args)

  def paired(self, a: dict, b: dict) -> tuple[float, float]:
    """Mean and SE (points) of final accuracy a - b over seeds 0-2."""
    d = 100 * np.array([self.final(**a, seed=s) - self.final(**b, seed=s) for s in SEEDS])
    return d.mean(), d.std(ddof=1) / np.sqrt(len(d))


def points(x: float) -> str:
  return f"{100 * x:+.2f}"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--archive", type=pathlib.Path, default=pathlib.Path("results/fmnist"))
  archive = Archive(parser.parse_args().archive)
  softmax, relu0 = dict(attention="softmax"), dict(alpha=0.0)

  print("1. softmax's test loss at 40 epochs (min, where, final) and at 80 (seed 0)")
  for seed in SEEDS:
    evals = archive.evals(**softmax, epochs=40, seed=seed)
    best = min(evals, key=lambda s: evals[s]["test/loss"])
    print(f"   seed {seed}: min {evals[best]['test/loss']:.3f} at {best / max(evals):.1%} of "
          f"training, final {evals[max(evals)]['test/loss']:.3f}; last quarter "
          f"{points(archive.last_quarter(**softmax, epochs=40, seed=seed))}")
  evals = archive.evals(**softmax, epochs=80)
  top = max(evals, key=lambda s: evals[s]["test/prec@1"])
  print(f"   80 epochs: final test loss {evals[max(evals)]['test/loss']:.3f}, accuracy "
        f"{archive.final(**softmax, epochs=80):.4f} ("
        f"{points(archive.final(**softmax, epochs=80) - archive.final(**softmax, epochs=40))} "
        f"from 40 epochs), best {evals[top]['test/prec@1']:.4f} at epoch "
        f"{80 * top / max(evals):.0f}")
  for epochs in (40, 80):
    train = metrics.read_metrics(archive.root / "runs" / fmnist.run(**softmax,
                                                                     epochs=epochs).run_id)
    total = max(train)
    losses = [r["training_loss"] for s, r in train.items()
              if "training_loss" in r and s >= 0.98 * total]
    print(f"   training loss, mean over the last 2% of {epochs} epochs: {np.mean(losses):.3f}")

  print("2. relu/L - softmax (points)")
  for epochs in (20, 40):
    mean, se = archive.paired(dict(epochs=epochs), dict(**softmax, epochs=epochs))
    print(f"   {epochs} epochs, seeds 0-2: {mean:+.2f} (SE {se:.2f}); seed 0 "
          f"{points(archive.final(epochs=epochs) - archive.final(**softmax, epochs=epochs))}")
  print(f"   80 epochs, seed 0: "
        f"{points(archive.final(epochs=80) - archive.final(**softmax, epochs=80))}")
  # Every relu/L - softmax pair of the study's recipes (the calibration's 10-epoch and lr 2e-3
  # pairs left out): phase A at 20 and 40 epochs, phase 16 at 80, phase D at L = 49.
  pairs = ([dict(epochs=e, seed=s) for e in (20, 40) for s in SEEDS] + [dict(epochs=80)]
           + [dict(size=z, patch=4, seed=s) for z in fmnist.SIZES for s in SEEDS])
  gaps = np.array([[archive.final(**p) - archive.final(**p, **softmax),
                    archive.final("test/loss", **p) - archive.final("test/loss", **p, **softmax)]
                   for p in pairs])
  print(f"   r(accuracy gap, test-loss gap) over {len(pairs)} pairs: "
        f"{np.corrcoef(gaps.T)[0, 1]:.3f}; without the 80-epoch pair: "
        f"{np.corrcoef(np.delete(gaps, pairs.index(dict(epochs=80)), axis=0).T)[0, 1]:.3f}")

  print("3. relu alpha 0 and alpha 1 - alpha 0")
  gains = [archive.final(**relu0, epochs=40, seed=s) - archive.final(**relu0, seed=s)
           for s in SEEDS]
  print(f"   alpha 0, 20 -> 40 epochs: {100 * np.mean(gains):+.2f} (seeds: "
        f"{', '.join(points(g) for g in gains)}); its last quarters at 40: "
        f"{', '.join(points(archive.last_quarter(**relu0, epochs=40, seed=s)) for s in SEEDS)}")
  for epochs in (20, 40):
    mean, se = archive.paired(dict(epochs=epochs), dict(**relu0, epochs=epochs))
    print(f"   alpha 1 - alpha 0 at {epochs} epochs: {mean:+.2f} (SE {se:.2f})")

  arms = [[archive.final(**arm, seed=s) for s in SEEDS] for arm in fmnist.PHASE_A_ARMS]
  sigma = 100 * np.sqrt(np.mean([np.var(a, ddof=1) for a in arms]))
  noise = 2 * np.sqrt(2) * sigma
  print(f"4. sigma {sigma:.2f} points, single-seed noise {noise:.2f}; seed 0 at L = 196 by alpha:")
  for attention in ("relu", "relu2"):
    accs = {a: archive.final(attention=attention, alpha=a) for a in fmnist.ALPHAS}
    print(f"   {attention}: " + ", ".join(f"{a:g} {v:.4f}" for a, v in accs.items())
          + f"; alpha 1.5 - alpha 1 {points(accs[1.5] - accs[1.0])}, "
          f"alpha 2 - alpha 1 {points(accs[2.0] - accs[1.0])}")

  print("5. qk-LN, with - without (seed 0, 20 epochs)")
  for attention in ("relu", "relu2"):
    for alpha in fmnist.ABLATION_ALPHAS:
      arm = dict(attention=attention, alpha=alpha)
      delta = 100 * (archive.final(**arm) - archive.final(**arm, qk_norm=False))
      print(f"   {attention} alpha {alpha:g}: {delta:+.2f}"
            + (" (beyond the noise)" if abs(delta) > noise else ""))

  print("6. 10-shot transfer (mnist5k and digits, fixed l2)")
  pixels = json.loads((archive.root / "baselines" / "p2.json").read_text())
  runs = sorted(p.name for p in (archive.root / "runs").iterdir())
  curves = {}
  for name in runs:
    records = metrics.read_metrics(archive.root / "runs" / name)
    curves[name] = {s: r for s, r in records.items() if s > 1 and TRANSFER in r}
  finals = [c[max(c)][TRANSFER] for c in curves.values()]
  print(f"   raw pixels {pixels['fewshot/pixels/10shot_avg']:.3f}; the {len(runs)} trained runs: "
        f"final {min(finals):.3f} to {max(finals):.3f}, highest at any evaluation "
        f"{max(r[TRANSFER] for c in curves.values() for r in c.values()):.3f}")
  early = sum(max(c, key=lambda s: c[s][TRANSFER]) < max(c) for c in curves.values())
  print(f"   runs whose transfer peaks before their last evaluation: {early} of {len(runs)}")
  for arm in (softmax, {}):
    means = {e: np.mean([archive.final(TRANSFER, **arm, epochs=e, seed=s) for s in SEEDS])
             for e in (20, 40)}
    print(f"   {arm.get('attention', 'relu/L')}: seed mean {means[20]:.3f} at 20 epochs, "
          f"{means[40]:.3f} at 40; seed 0 at 80: {archive.final(TRANSFER, **arm, epochs=80):.3f}")
  chosen = sorted({v for c in curves.values() for k, v in c[max(c)].items() if "_loo_l2_" in k})
  logged = sum(any("_loo_l2_" in k for k in c[max(c)]) for c in curves.values())
  pixel_l2 = sorted({v for k, v in pixels.items() if k.startswith("fewshot/pixels/")
                     and "_loo_l2_" in k})
  print(f"   leave-one-out l2 at the final evaluation ({logged} of {len(runs)} runs log it): "
        f"{chosen[0]:g} to {chosen[-1]:g}; raw pixels: {pixel_l2[0]:g} to {pixel_l2[-1]:g}")

  print("7. Figure 1 at L = 49 (20 epochs), seed means")
  for arm in (softmax, {}):
    means = {z: np.mean([archive.final(**arm, size=z, patch=4, seed=s) for s in SEEDS])
             for z in fmnist.SIZES}
    print(f"   {arm.get('attention', 'relu/L')}: "
          + ", ".join(f"{z} {m:.4f}" for z, m in means.items())
          + f"; B - Ti {points(means['B'] - means['Ti'])}")

  print("8. held-out seed (relu/L, seed 3) against seeds 0-2's mean +- 2 sd (20 epochs)")
  accs = [archive.final(seed=s) for s in SEEDS]
  spread = np.mean(accs) + 2 * np.array([-1, 1]) * np.std(accs, ddof=1)
  print(f"   {archive.final(seed=fmnist.HELD_OUT_SEED):.4f} against {spread[0]:.4f} to "
        f"{spread[1]:.4f}")

  print("9. what the rules added later saw: the calibration (seed 0, L = 196) and phase 14")
  for epochs, lr in fmnist.CALIBRATION:
    for arm in (softmax, {}):
      run = dict(**arm, epochs=epochs, lr=lr)
      evals = archive.evals(**run)
      before = max(s for s in evals if s <= 0.75 * max(evals))  # the reading until 15eeb47
      print(f"   {arm.get('attention', 'relu/L')} {epochs} epochs lr {lr:g}: "
            f"{archive.final(**run):.4f}, last quarter {points(archive.last_quarter(**run))} "
            f"(from the last evaluation at or before 75%: "
            f"{points(archive.final(**run) - evals[before]['test/prec@1'])})")
  for arm in (softmax, {}):
    evals = archive.evals(**arm, epochs=40)
    print(f"   {arm.get('attention', 'relu/L')} at 40 epochs: "
          + ", ".join(f"step {s} {evals[s]['test/prec@1']:.4f}" for s in sorted(evals)[:5])
          + f"; gain over 20 epochs "
          f"{points(archive.final(**arm, epochs=40) - archive.final(**arm))}")


if __name__ == "__main__":
  main()
