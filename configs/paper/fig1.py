r"""Figure 1 (scaling): softmax vs relu/seqlen for S/32, S/16, B/32, B/16, L/16 on ImageNet-21k
(30 epochs, qk-layernorm). Panels: ImageNet-1k accuracy (left) and average 10-shot linear
transfer on 8 datasets (right) against TPU core hours. 10 runs.

    python -m big_vision_relu.experiments.sweep configs/paper/fig1.py --list
    bash launch/tpu/sweep.sh configs/paper/fig1.py          # on a TPU VM (see README)
    python -m big_vision_relu.experiments.report --sweep configs/paper/fig1.py \
        --root gs://BUCKET
"""
from big_vision_relu.experiments.sweep import Run

VARIANTS = ("S/32", "S/16", "B/32", "B/16", "L/16")


def get_sweep() -> list[Run]:
  return [Run("configs/vit_i21k.py", dict(variant=v, attention=a, alpha=1.0, qk_norm=True,
                                          gated=False))
          for v in VARIANTS for a in ("softmax", "relu")]
