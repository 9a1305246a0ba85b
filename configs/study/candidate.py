r"""The candidate recipe of rule E2 (docs/reproduction.md 1.2, "If the recipe stays short of
(b)"): phase A (softmax, relu/L, relu at alpha 0; seeds 0-2; L = 196) trained for 40 epochs, and
softmax and relu/L (seed 0) for 80, the candidate's rule (c). Seed 0's 40-epoch softmax and
relu/L are configs/study/twice_as_long.py's runs, trained once.

    python -m big_vision_relu.experiments.sweep configs/study/candidate.py --list

Expected: about 5.6 core hours a 40-epoch run and 11 an 80-epoch one at the pinned commit (the
report's estimate; `bash launch/study.sh fmnist` trains them); the report (`bash launch/study.sh
fmnist report`) then judges phase A's claims at 40 epochs beside the 20-epoch ones and says
whether each 80-epoch run gains < 1 point over its 40-epoch twin (point 3 of issue #22).
"""
from big_vision_relu.experiments import fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.candidate()
