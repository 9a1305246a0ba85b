r"""Figure 4 (gating ablation): ImageNet-1k accuracy (21k head) against alpha for relu and relu^2
attention, with and without the gated attention unit, for S/32, S/16, S/8 on ImageNet-21k (30
epochs, qk-layernorm). The paper reports gating costs ~9.3% more core hours for S/8 relu.
3 x 2 x 8 x 2 = 96 runs (the ungated half shared with Figure 2).

    python -m big_vision_relu.experiments.sweep configs/paper/fig4.py --list
"""
from big_vision_relu.experiments import recipes
from big_vision_relu.experiments.sweep import Run


def get_sweep() -> list[Run]:
  return recipes.I21K_GRID.ablation("gated", recipes.ALPHAS,
                                    variant=recipes.ALPHA_SWEEP_VARIANTS)
