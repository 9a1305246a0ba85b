r"""Figure 1 on Fashion-MNIST at L = 49 (patch 4, the cheap setting): softmax vs relu/L for
three model sizes (Ti, S, B: width 64, 96, 128; head dim 32), 3 seeds each.

    python -m big_vision_relu.experiments.sweep configs/study/fig1.py --list
"""
from big_vision_relu.experiments import fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  # A seed's softmax and relu/L next to each other: the study's two workers start them together
  # or one after the other, so a pair trains on one machine (docs/reproduction.md 1.4).
  return [fmnist.run(size=size, patch=4, attention=a, seed=seed) for size in fmnist.SIZES
          for seed in fmnist.SEEDS for a in ("softmax", "relu")]
