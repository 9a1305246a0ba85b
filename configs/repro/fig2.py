r"""Figure 2 analogue: mnist5k test accuracy against alpha for the 7 activations of
`L^-alpha * h`, plus softmax, for the S model at patch 4 (L = 49) and patch 2 (L = 196),
qk-layernorm on. Seed 0 everywhere; seeds 1 and 2 too at alpha 0 and 1 (and for softmax).
2 x (7 x 8 + 1) = 114 runs with seed 0, plus 2 x 2 x (7 x 2 + 1) = 60 seed repeats.

    python -m big_vision_relu.experiments.sweep configs/repro/fig2.py --list
    python -m big_vision_relu.experiments.report --sweep configs/repro/fig2.py \
        --root results/repro --out docs/reproduction
"""
from big_vision_relu.experiments.studies import repro
from big_vision_relu.experiments.sweep import Run

FIGURE = repro.FIGURE


def get_sweep() -> list[Run]:
  return repro.fig2()
