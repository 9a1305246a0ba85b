r"""Images per second per core as archived runs paid them: the trainers' own count.

    python benchmarks/archived_throughput.py 'results/repro/runs/mnist_vit-S-p2-*' \
        'results/fmnist/runs/fmnist_vit-Ti-p2-relu-a1-qk_norm-nogated-e20-seed[123]'

For each glob of archived run directories (config.json and metrics.jsonl, as a study archives
them): a run's training images (last logged step x the config's batch size) over its
last logged `core_hours` (CPU seconds of its trainer over all its starts: input, steps,
evaluations and each start's compilation). No timing of its own: the runs were trained on
whatever machine and load their archive says, so two globs compare studies as they ran, not
configs under one load (`study_throughput.py` does that).
"""
from __future__ import annotations

import argparse
import glob
import json
import pathlib
import statistics

from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import run_status


def paid_rate(run_dir: pathlib.Path) -> float:
  """Training images per core-second that the archived run in `run_dir` paid."""
  batch_size = json.loads((run_dir / "config.json").read_text())["input"]["batch_size"]
  records = metrics_lib.read_metrics(run_dir)
  core_hours = run_status.last_values(records, (run_status.CORE_HOURS,)).get(
      run_status.CORE_HOURS)
  if not core_hours:
    raise ValueError(f"{run_dir}: no step with core_hours in metrics.jsonl")
  return max(records) * batch_size / (core_hours * 3600)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("globs", nargs="+", help="globs of archived run directories")
  for pattern in parser.parse_args().globs:
    rates = sorted(paid_rate(pathlib.Path(d)) for d in glob.glob(pattern))
    if not rates:
      raise SystemExit(f"{pattern!r}: no run directory matches")
    print(f"{pattern}: {len(rates)} runs, img/s/core median {statistics.median(rates):.1f} "
          f"[min {rates[0]:.1f}, max {rates[-1]:.1f}]")


if __name__ == "__main__":
  main()
