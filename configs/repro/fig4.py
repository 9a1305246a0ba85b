r"""Figure 4 analogue: relu and relu2 over the alpha grid with and without the attention gate,
S model at patch 4 and 2, seed 0 (the runs without the gate are Figure 2's). 64 runs. The
report's table gives the gate's cost: core hours with / without, over matched runs.

    python -m big_vision_relu.experiments.report --sweep configs/repro/fig4.py \
        --root results/repro --out docs/reproduction
"""
from big_vision_relu.experiments.studies import repro
from big_vision_relu.experiments.sweep import Run

FIGURE = repro.FIGURE


def get_sweep() -> list[Run]:
  return repro.fig4()
