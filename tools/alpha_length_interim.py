"""Recomputes the numbers of docs/alpha_length.md section 6 that its report does not print: the
seed-paired alpha 1.5 - alpha 1 differences (validation score and test at the selected step) at
L = 16 and 49, and what H1 and H0 predict for alpha*(196) from the complete lengths' alpha*.

    python tools/alpha_length_interim.py [--archive results/alpha_length]
"""
import argparse
import pathlib

import numpy as np

from big_vision_relu.experiments.studies.alpha_length import protocol as al
from big_vision_relu.experiments.studies.alpha_length import report


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--archive", type=pathlib.Path, default=pathlib.Path("results/alpha_length"))
  runs = report.collect(parser.parse_args().archive)
  for patch in (7, 4):
    cells = report._by_cell(runs, patch)
    high, low = cells["relu a1.5"], cells["relu a1"]
    for readout in ("val_best", "test_at_best"):
      test = al.paired_test([getattr(high[s].result, readout) for s in al.SEEDS],
                            [getattr(low[s].result, readout) for s in al.SEEDS])
      print(f"L = {al.PATCH_TO_LENGTH[patch]}: alpha 1.5 - alpha 1, {readout}: "
            f"{100 * test.mean:+.2f} [{100 * test.lower:+.2f}, {100 * test.upper:+.2f}]")
  stars = al.alpha_stars(report.complete_accuracies(runs))
  lengths = sorted(stars)
  values = np.array([stars[n].alpha for n in lengths])
  inv = 1 / np.log(lengths)
  k = float(inv @ values / (inv @ inv))  # H0: alpha* = K / ln L, least squares
  print(f"H1 predicts alpha*(196) = {values.mean():.2f}; H0 (K = {k:.2f}) {k / np.log(196):.2f}")


if __name__ == "__main__":
  main()
