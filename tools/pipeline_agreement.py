r"""Trains the main job's recipe on both input pipelines, some seeds; prints the table, the verdict.

    PYTHONPATH=. python tools/pipeline_agreement.py --seeds 3,4,5,6,7 --out /tmp/agreement
    PYTHONPATH=. python tools/pipeline_agreement.py --seeds 0,1,2,3,4,5,6,7 \
        --config configs/study/fmnist_vit.py:patch=7,epochs=5 --out /tmp/agreement_fmnist

Runs `python -m big_vision_relu.train --config CONFIG,input=P,seed=S` (CONFIG default
configs/local/mnist_relu.py) for P in (tfds, memory) and every seed, `--jobs` at a time,
into OUT/P-S (a finished workdir is
only read again: the trainer returns at once), then reads each run's last `test/prec@1` and
`test/loss` and applies the rule of docs/benchmarks.md section 7a: d = mean(memory) -
mean(tfds) with its Welch 90% interval; "agree" when it lies inside +-MARGIN, "differ" when it
excludes 0 and reaches beyond the margin, "not shown" otherwise.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys

from scipy import stats

PIPELINES = ("tfds", "memory")
MARGIN = 0.006  # test prec@1: 6 of the 1,000 test images


def train(config: str, out: pathlib.Path, pipeline: str, seed: int) -> pathlib.Path:
  workdir = out / f"{pipeline}-{seed}"
  config += ("," if ":" in config else ":") + f"input={pipeline},seed={seed}"
  command = [sys.executable, "-m", "big_vision_relu.train", "--config", config,
             "--workdir", str(workdir)]
  with open(out / f"{pipeline}-{seed}.log", "ab") as log:
    subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  return workdir


def final_metrics(workdir: pathlib.Path) -> dict[str, float]:
  """The last logged value of each metric of the run (metrics.jsonl)."""
  last: dict[str, float] = {}
  with open(workdir / "metrics.jsonl") as f:
    for line in f:
      last.update(json.loads(line))
  return last


def interval(memory: list[float], tfds: list[float]) -> tuple[float, float, float]:
  """mean(memory) - mean(tfds) and its Welch 90% confidence interval."""
  test = stats.ttest_ind(memory, tfds, equal_var=False)
  low, high = test.confidence_interval(0.90)
  return sum(memory) / len(memory) - sum(tfds) / len(tfds), float(low), float(high)


def verdict(low: float, high: float, margin: float) -> str:
  if -margin < low and high < margin:
    return "agree"
  if (low > 0 or high < 0) and (low <= -margin or high >= margin):
    return "differ"
  return "not shown"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seeds", required=True, help="comma-separated, e.g. 3,4,5,6,7")
  parser.add_argument("--config", default="configs/local/mnist_relu.py",
                      help="config[:args], with `input` and `seed` arguments")
  parser.add_argument("--out", required=True, type=pathlib.Path)
  parser.add_argument("--jobs", type=int, default=2, help="trainers at a time")
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  args.out.mkdir(parents=True, exist_ok=True)
  with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
    runs = {(p, s): pool.submit(train, args.config, args.out, p, s)
            for s in seeds for p in PIPELINES}
    workdirs = {key: run.result() for key, run in runs.items()}
  metrics = {key: final_metrics(w) for key, w in workdirs.items()}
  print("| pipeline | seed | test prec@1 | test loss | core hours |\n|---|---|---|---|---|")
  for (p, s), m in sorted(metrics.items()):
    print(f"| {p} | {s} | {m['test/prec@1']:.3f} | {m['test/loss']:.4f} | "
          f"{m['core_hours']:.4f} |")
  for name, margin in (("test/prec@1", MARGIN), ("test/loss", None)):
    values = {p: [metrics[p, s][name] for s in seeds] for p in PIPELINES}
    d, low, high = interval(values["memory"], values["tfds"])
    rule = f": {verdict(low, high, margin)} (margin +-{margin})" if margin else ""
    print(f"{name}: memory - tfds = {d:+.4f}, 90% CI [{low:+.4f}, {high:+.4f}]{rule}")


if __name__ == "__main__":
  main()
