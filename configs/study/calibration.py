r"""The recipe's calibration: softmax and relu/L (seed 0, L = 196) at each of fmnist.CALIBRATION's
(epochs, lr) points; those at the recipe's own point are phase A's seed-0 runs
(docs/reproduction.md, 1.2).

    python -m big_vision_relu.experiments.sweep configs/study/calibration.py --list
"""
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.calibration_sweep()
