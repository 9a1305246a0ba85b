r"""Figure 4 on Fashion-MNIST at L = 196: relu and relu2 at alpha 0, 1, 1.5 with the paper's
gated attention (the ungated twins are Figure 2's runs, trained once). Seed 0.

    python -m big_vision_relu.experiments.sweep configs/study/fig4.py --list
"""
from big_vision_relu.experiments import fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.GRID.ablation("gated", fmnist.ABLATION_ALPHAS)
