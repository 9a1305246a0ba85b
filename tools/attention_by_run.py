r"""What each run's attention does, one row per run: for comparing runs that differ in one knob.

Loads every workdir given (its newest checkpoint), runs its first eval images through the
model (`big_vision_relu.inspect`) and prints, per layer, the statistics that say whether the
attention still moves information between tokens:

  attention / residual   mean |attention branch| / |residual stream entering the block|
  row sum p50            median over rows of sum_k w (L^-alpha sum_k h(s); softmax: 1)
  logit std              std of the scores q.k / sqrt(head_dim) (after qk-LN)

with the run's final test accuracy from its metrics.jsonl. docs/reproduction.md ("Why large
alpha fails at L = 196") was made with

    python tools/attention_by_run.py workdirs/repro/runs/mnist_vit-S-p2-* \
        --csv docs/reproduction/attention_by_run.csv > docs/reproduction/attention_by_run.md

(the workdirs of the study's finished runs at L = 196 that were still on disk: checkpoints
are not archived, so this needs the machine that trained them, or the runs retrained).
"""
from __future__ import annotations

import argparse
import csv
import pathlib
import sys

from big_vision_relu import inspect

# (column, statistic of inspect.layer_table, format)
COLUMNS = (("attention / residual", "attention_to_residual", "{:.3f}"),
           ("row sum p50", "row_sum_p50", "{:.3g}"),
           ("logit std", "logit_std", "{:.2f}"))
ACCURACY = "test/prec@1"


def run_row(workdir: str, num_images: int) -> dict[str, object] | None:
  """The run's attention, seqlen_alpha, qk_norm, gated, seed, final test accuracy and per-layer
  statistics (lists, one value per layer); None if its newest checkpoint has no accuracy (a
  run still training)."""
  run = inspect.load_run(workdir)
  steps, accuracies = inspect.read_metrics(workdir)[ACCURACY]
  if steps[-1] != run.step:
    print(f"skipped {workdir}: checkpoint step {run.step}, test accuracy logged at step "
          f"{steps[-1]} (still training?)", file=sys.stderr)
    return None
  images, _ = inspect.eval_examples(run, num_images)
  table = inspect.layer_table(inspect.run_model(run, images))
  attention = run.model.attention_options
  return {"run": pathlib.Path(workdir).name, "attention": attention.activation,
          "alpha": attention.seqlen_alpha, "qk_norm": attention.qk_norm,
          "gated": attention.gated, "seed": run.config["seed"], "step": run.step,
          ACCURACY: float(accuracies[-1]),
          **{stat: [row[stat] for row in table] for _, stat, _ in COLUMNS}}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("workdirs", nargs="+", help="training workdirs")
  parser.add_argument("--num_images", type=int, default=64,
                      help="eval images the statistics are computed on")
  parser.add_argument("--csv", type=pathlib.Path, help="also write one line per run and layer")
  args = parser.parse_args()

  rows = sorted(filter(None, (run_row(workdir, args.num_images) for workdir in args.workdirs)),
                key=lambda r: (r["attention"], not r["qk_norm"], r["gated"], r["alpha"],
                               r["seed"]))
  print(f"Per layer (0 to last), on the first {args.num_images} eval images of each run.\n")
  print("| attention | qk-LN | gate | alpha | seed | test acc | "
        + " | ".join(c for c, _, _ in COLUMNS) + " |")
  print("|---" * (6 + len(COLUMNS)) + "|")
  for row in rows:
    cells = [" / ".join(fmt.format(v) for v in row[stat]) for _, stat, fmt in COLUMNS]
    alpha = "-" if row["attention"] == "softmax" else f"{row['alpha']:g}"  # softmax has none
    flags = " | ".join("on" if row[flag] else "off" for flag in ("qk_norm", "gated"))
    print(f"| {row['attention']} | {flags} | {alpha} | {row['seed']} | {row[ACCURACY]:.3f} | "
          + " | ".join(cells) + " |")
  if args.csv:
    with open(args.csv, "w", newline="") as f:
      writer = csv.writer(f)
      keys = ("run", "attention", "qk_norm", "gated", "alpha", "seed", "step", ACCURACY)
      writer.writerow([*keys, "layer", *(stat for _, stat, _ in COLUMNS)])
      for row in rows:
        for layer, values in enumerate(zip(*(row[stat] for _, stat, _ in COLUMNS))):
          writer.writerow([*(row[key] for key in keys), layer, *values])


if __name__ == "__main__":
  main()
