r"""Figure 4 on Fashion-MNIST at L = 196: relu and relu2 at alpha 0, 1, 1.5 with the paper's
gated attention (the ungated twins are Figure 2's runs, trained once). Seed 0; relu2's gated
alpha 0 and 1 also at seeds 1-2, for the paired gate row (docs/reproduction.md 1.2).

    python -m big_vision_relu.experiments.sweep configs/study/fig4.py --list
"""
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.fig4()
