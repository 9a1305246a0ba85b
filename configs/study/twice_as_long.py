r"""The recipe trained twice as long: softmax and relu/L (alpha 1), seed 0, L = 196, for 40
epochs instead of 20 (docs/reproduction.md 1.2, "The recipe trained twice as long"); their
20-epoch twins are phase A's seed-0 runs.

    python -m big_vision_relu.experiments.sweep configs/study/twice_as_long.py --list

`bash launch/study.sh fmnist` trains them from the pinned commit; the report (`bash
launch/study.sh fmnist report`) says whether each gains < 1 point over its 20-epoch twin.
Measured (docs/fmnist/verdicts.md): 5.7 (softmax) and 5.3 (relu/L) core hours; softmax 0.9026
(+0.26 points over 20 epochs, last quarter +0.24), relu/L 0.9087 (+1.13): rule (c) on the
20-epoch recipe not met, rule E1 met (40 epochs the candidate, configs/study/candidate.py).
"""
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.twice_as_long()
