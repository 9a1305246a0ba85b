r"""Figure 1 on Fashion-MNIST at L = 49 (patch 4, the cheap setting): softmax vs relu/L for
three model sizes (Ti, S, B: width 64, 96, 128; head dim 32), 3 seeds each.

    python -m big_vision_relu.experiments.sweep configs/study/fig1.py --list
"""
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.fig1()
