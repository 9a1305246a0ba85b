r"""Figure 3 analogue: relu and relu2 over the alpha grid with and without qk-layernorm, S model
at patch 4 and 2, seed 0 (the runs with qk-LN are Figure 2's). 2 x 2 x 8 x 2 = 64 runs.

    python -m big_vision_relu.experiments.report --sweep configs/repro/fig3.py \
        --root results/repro --out docs/reproduction
"""
from big_vision_relu.experiments.studies import repro
from big_vision_relu.experiments.sweep import Run

FIGURE = repro.FIGURE


def get_sweep() -> list[Run]:
  return repro.fig3()
