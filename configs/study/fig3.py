r"""Figure 3 on Fashion-MNIST at L = 196: relu and relu2 at alpha 0, 1, 1.5 without qk-layernorm
(the qk-LN-on twins are Figure 2's runs, trained once). Seed 0.

    python -m big_vision_relu.experiments.sweep configs/study/fig3.py --list
"""
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.fig3()
