r"""The recipe trained twice as long: softmax and relu/L (alpha 1), seed 0, L = 196, for 40
epochs instead of 20 (docs/reproduction.md 1.2, "The recipe trained twice as long"); their
20-epoch twins are phase A's seed-0 runs.

    python -m big_vision_relu.experiments.sweep configs/study/twice_as_long.py --list

Expected: about 6.5 core hours a run at the pinned commit (the report's estimate; `bash
launch/study.sh fmnist` trains them); the report (`bash launch/study.sh fmnist report`) then says
whether each gains < 1 point over its 20-epoch twin.
"""
from big_vision_relu.experiments import fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.twice_as_long()
