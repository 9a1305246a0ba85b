r"""Figure 2 (the alpha sweep): ImageNet-1k accuracy against alpha for the 7 activations of
`L^-alpha * h`, plus the softmax baseline (one horizontal line per panel), for S/32, S/16, S/8
trained on ImageNet-21k (30 epochs; i1k accuracy of the 21k head) and on ImageNet-1k
(300 epochs). qk-layernorm on. 2 x 3 x (7 x 8 + 1) = 342 runs.

Alpha grid (recipes.ALPHAS): the paper gives none (its text says [0, 1], its plots run to 2);
we use 0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 2: dense around the predicted optimum 1, both ends.

    python -m big_vision_relu.experiments.sweep configs/paper/fig2.py --list
"""
from big_vision_relu.models.attention import PAPER_ACTIVATIONS
from big_vision_relu.experiments.recipes import ALPHA_SWEEP_VARIANTS, ALPHAS
from big_vision_relu.experiments.sweep import Run


def get_sweep() -> list[Run]:
  runs = []
  for config in ("configs/vit_i21k.py", "configs/vit_i1k.py"):
    for variant in ALPHA_SWEEP_VARIANTS:
      runs.append(Run(config, dict(variant=variant, attention="softmax", alpha=1.0,
                                   qk_norm=True, gated=False)))
      runs += [Run(config, dict(variant=variant, attention=activation, alpha=alpha,
                                qk_norm=True, gated=False))
               for activation in PAPER_ACTIVATIONS for alpha in ALPHAS]
  return runs
