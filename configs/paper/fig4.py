r"""Figure 4 (gating ablation): ImageNet-1k accuracy (21k head) against alpha for relu and relu^2
attention, with and without the gated attention unit, for S/32, S/16, S/8 on ImageNet-21k (30
epochs, qk-layernorm). The paper reports gating costs ~9.3% more core hours for S/8 relu.
3 x 2 x 8 x 2 = 96 runs (the ungated half shared with Figure 2).

    python -m big_vision_relu.sweep configs/paper/fig4.py --list
"""
from big_vision_relu.sweep import Run

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
VARIANTS = ("S/32", "S/16", "S/8")


def get_sweep() -> list[Run]:
  return [Run("configs/vit_i21k.py", dict(variant=v, attention=a, alpha=alpha, qk_norm=True,
                                          gated=gated))
          for v in VARIANTS for a in ("relu", "relu2") for alpha in ALPHAS
          for gated in (False, True)]
