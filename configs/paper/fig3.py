r"""Figure 3 (qk-layernorm ablation): ImageNet-1k accuracy (21k head) against alpha for relu and
relu^2 attention, with and without qk-layernorm, for S/32, S/16, S/8 on ImageNet-21k (30
epochs). 3 x 2 x 8 x 2 = 96 runs; the qk_norm=True half is shared with Figure 2's i21k runs
(same run ids, so a shared workdir root trains them once).

    python -m big_vision_relu.experiments.sweep configs/paper/fig3.py --list
"""
from big_vision_relu.experiments import recipes
from big_vision_relu.experiments.sweep import Run


def get_sweep() -> list[Run]:
  return recipes.I21K_GRID.ablation("qk_norm", recipes.ALPHAS,
                                    variant=recipes.ALPHA_SWEEP_VARIANTS)
