r"""ViT on ImageNet-1k from scratch, the paper's base recipe (big_vision's vit_i1k.py, 300
epochs), with the attention as config arguments.

    python -m big_vision_relu.train --workdir gs://BUCKET/runs/i1k_S16_relu \
        --config configs/vit_i1k.py:variant=S/16,attention=relu,alpha=1.0,qk_norm=True

Arguments: variant, attention, alpha, qk_norm, gated, fsdp, runlocal (as in vit_i21k.py).

Recipe (the paper, "Replacing softmax with ReLU in Vision Transformers", arXiv:2309.08586, on
big_vision's): imagenet2012 `train[:99%]` (minival `train[99%:]`), eval on `validation` and
ImageNet-v2; 300 epochs, batch 4096, 224px, inception crop + flip + RandAugment(2, 15) + mixup
(0.2 for S/32, 0.5 otherwise), sigmoid cross-entropy, class token with a pre-logits layer
(Dense + tanh), head bias -6.9, the optimizer of vit_i21k.py (all set below).
Steps: 300 epochs of 1,268,355 images (99% of 1,281,167) at batch 4096 = 92,898 steps (~9.3e4).
S/8 (not in the paper's configs) gets S/16's augmentation. ImageNet-ReaL is not included: its
multi-label `real_label` needs a pp op for variable-length label lists that we do not have yet.
"""
import ml_collections

from big_vision_relu.experiments import recipes
from big_vision_relu.config import optional, parse_arg

MIXUP = {"S/32": 0.2}  # every other variant: 0.5


def train_pp(size: int = 224) -> str:
  return (f"decode_jpeg_and_inception_crop({size})|flip_lr|randaug(2, 15)|value_range(-1, 1)|"
          'onehot(1000)|keep("image", "labels")')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = parse_arg(arg, variant="B/16", attention="relu", alpha=1.0, qk_norm=True, gated=False,
                  fsdp=False, runlocal=False)
  config = ml_collections.ConfigDict()
  config.seed = 0
  # Optional fields (placeholders): --config.total_epochs=None --config.total_steps=N works.
  config.total_epochs = optional(300)
  config.total_steps = optional()
  config.input = dict(data=dict(name="imagenet2012", split="train[:99%]"), batch_size=4096,
                      pp=train_pp())
  config.num_classes = 1000
  config.init_head_bias = -6.9
  config.loss = "sigmoid_xent"
  config.mixup = dict(p=MIXUP.get(arg.variant, 0.5), fold_in=optional())
  config.model = dict(
      variant=arg.variant, pool_type="tok", posemb="learn", rep_size=True,
      attention=arg.attention, seqlen_alpha=arg.alpha, qk_norm=arg.qk_norm, gated=arg.gated,
  )
  # big_vision's ViT optimizer: Adam with a bfloat16 first moment, global clip 1.0, lr 1e-3
  # with 10k warmup steps then cosine to 0.
  config.optax_name = "scale_by_adam"
  config.optax = dict(b1=0.9, b2=0.999, mu_dtype="bfloat16")
  config.grad_clip_norm = 1.0
  config.lr = 1e-3
  config.wd = 1e-4  # decoupled, not multiplied by lr: AdamW's 0.1
  config.schedule = dict(warmup_steps=10_000, decay_type="cosine")
  if arg.fsdp:  # params and optimizer state sharded over the data axis
    config.sharding_strategy = [(".*", 'fsdp(axis="data")')]
  config.log_training_steps = 50
  config.ckpt_steps = 1000
  config.keep_ckpt_steps = 10_000

  pp_eval = recipes.eval_pp(1000)
  config.evals = ml_collections.ConfigDict()
  config.evals.minival = dict(type="classification",
                              data=dict(name="imagenet2012", split="train[99%:]"),
                              pp_fn=pp_eval, batch_size=1024, log_steps=2500)
  config.evals.i1k = dict(type="classification", data=dict(name="imagenet2012",
                                                           split="validation"),
                          pp_fn=pp_eval, batch_size=1024, log_steps=2500)
  config.evals.v2 = dict(type="classification", data=dict(name="imagenet_v2", split="test"),
                         pp_fn=pp_eval, batch_size=1024, log_steps=2500)
  # big_vision's few-shot preprocessing: resize(256)|central_crop(224).
  config.evals.fewshot = recipes.fewshot_eval(recipes.FEWSHOT_8, size=224, resize=256,
                                              batch_size=512, log_steps=10_000)
  if arg.runlocal:
    config = recipes.local_config(config)
  return config
