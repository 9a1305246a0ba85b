r"""Figure 2 on Fashion-MNIST at L = 196: test accuracy against alpha for relu and relu2 (alpha
0, 0.5, 1, 1.5, 2), gelu, softplus, sigmoid and identity (alpha 0 and 1), and softmax; qk-LN on.
Seeds 0-2 for softmax, relu at alpha 0 and 1 (phase A) and relu2 at alpha 0 and 1; seed 0
elsewhere.

    python -m big_vision_relu.experiments.sweep configs/study/fig2.py --list
"""
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.fig2()
