r"""The recipe's convergence check: softmax and relu/L (seed 0, L = 196) trained for twice the
recipe's epochs; their 1x twins are phase A's seed-0 runs (docs/reproduction.md, "Recipe").

    python -m big_vision_relu.experiments.sweep configs/study/calibration.py --list
"""
from big_vision_relu.experiments import fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return [*fmnist.calibration(), *(r for r in fmnist.phase_a() if r.args["seed"] == 0
                                   and r.args["alpha"] == 1.0)]
