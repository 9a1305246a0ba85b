r"""Figure 1 analogue: softmax vs relu/L attention over three model sizes (Ti, S, B; patch 4,
L = 49), 3 seeds each: mnist5k test accuracy and 10-shot digits transfer against CPU core
hours. 3 x 2 x 3 = 18 runs.

    python -m big_vision_relu.experiments.sweep configs/repro/fig1.py --list
    python -m big_vision_relu.experiments.report --sweep configs/repro/fig1.py \
        --root results/repro --out docs/reproduction
"""
from big_vision_relu.experiments.studies import repro
from big_vision_relu.experiments.sweep import Run

FIGURE = repro.FIGURE


def get_sweep() -> list[Run]:
  return repro.fig1()
