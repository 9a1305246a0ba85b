r"""The held-out seed: relu/L at L = 196, seed 3, retrained from the pinned commit after phase A;
it must land within mean +- 2 sd of its arm's seeds 0-2 (docs/reproduction.md, 1.2).

    python -m big_vision_relu.experiments.sweep configs/study/held_out.py --list
"""
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.held_out()
