r"""The candidate recipe of rule E2 (docs/reproduction.md 1.2, "If the recipe stays short of
(b)"): phase A (softmax, relu/L, relu at alpha 0; seeds 0-2; L = 196) trained for 40 epochs, and
softmax and relu/L (seed 0) for 80, the candidate's rule (c). Seed 0's 40-epoch softmax and
relu/L are configs/study/twice_as_long.py's runs, trained once.

    python -m big_vision_relu.experiments.sweep configs/study/candidate.py --list

`bash launch/study.sh fmnist` trains them from the pinned commit; the report (`bash
launch/study.sh fmnist report`) judges phase A's claims at 40 epochs beside the 20-epoch ones and
says whether each 80-epoch run gains < 1 point over its 40-epoch twin (point 3 of issue #22).
Measured (docs/fmnist/verdicts.md): 5.3-6.7 core hours a 40-epoch run (two trainers sharing 2
cores), 12.8 and 9.3 the 80-epoch ones; at 40 epochs relu/L - softmax = +0.62 points (SE 0.18)
and relu alpha 1 - alpha 0 = +1.51 (SE 0.04), both "holds"; at 80 epochs softmax 0.8978 and
relu/L 0.9068, -0.48 and -0.19 points from 40: point 3 met.
"""
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  return fmnist.candidate()
