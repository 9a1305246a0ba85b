r"""The main job: a small ViT with relu/L attention + qk-layernorm on the offline `mnist5k`.

    python -m big_vision_relu.train --config configs/local/mnist_relu.py \
        --workdir workdirs/mnist_relu

Arguments (`mnist_relu.py:key=value,...`):
  attention   softmax | relu | relu2 | gelu | softplus | identity | relu6 | sigmoid  (relu)
  alpha       seqlen_alpha: weights are L^-alpha * h(q.k/sqrt(d))                    (1.0)
  qk_norm     qk-layernorm                                                           (True)
  gated       the paper's gated attention                                            (False)
  patch       patch size: 7 -> L = 16 tokens, 4 -> L = 49, 2 -> L = 196              (7)
  epochs      training epochs over the 4,000 training images                         (30)
  seed        run seed                                                               (0)
  runlocal    a few-step smoke run (used by the tests)                               (False)
  input       tfds | memory: the input pipeline (config.input.pipeline); memory needs no
              TensorFlow (docs/gpu.md)                                               (tfds)

Expected (measured here, 2 CPU cores, 2026-11-24): test prec@1 0.940, 10-shot digits transfer
0.466 (fixed l2 = 2^10; leave-one-out l2 does better); `bash launch/local.sh` took 1 min 38 s
(2026-11-22, an AVX2 CPU: 0.937 and 0.49, 2 min 48 s).
Patch 7 with lr 3e-3 was the best of the five short recipes we
tried for this budget (patch 4: 0.905 at 30 epochs; random-crop or inception-crop augmentation
underfit in 30 epochs: 0.815 / 0.885).
"""
import ml_collections

from big_vision_relu.experiments import recipes
from big_vision_relu.config import optional, parse_arg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = parse_arg(arg, attention="relu", alpha=1.0, qk_norm=True, gated=False, patch=7,
                  epochs=30, seed=0, runlocal=False, input="tfds")
  config = ml_collections.ConfigDict()
  config.seed = arg.seed
  # Optional fields (placeholders): --config.total_epochs=None --config.total_steps=N works.
  config.total_epochs = optional(None if arg.runlocal else arg.epochs)
  config.total_steps = optional(6 if arg.runlocal else None)
  config.input = dict(
      data=dict(name="mnist5k", split="train"),
      batch_size=128 if not arg.runlocal else 16,
      pp=recipes.MNIST_PP,
  )
  if arg.input != "tfds":  # unset for tfds, the schema's default: existing workdirs match
    config.input.pipeline = arg.input
  config.num_classes = 10
  config.model = dict(
      patch_size=(arg.patch, arg.patch), width=64, depth=4, mlp_dim=256, num_heads=4,
      pool_type="gap", posemb="learn",
      attention=arg.attention, seqlen_alpha=arg.alpha, qk_norm=arg.qk_norm, gated=arg.gated,
  )
  # Tuned here for 4,000 images: lr 3e-3 with 5% warmup (see the docstring).
  config.loss = "softmax_xent"
  config.optax_name = "scale_by_adam"
  config.optax = dict(b1=0.9, b2=0.999)
  config.lr = 3e-3
  config.wd = 1e-4  # decoupled, not multiplied by lr
  config.grad_clip_norm = 1.0
  config.schedule = dict(warmup_percent=0.05, decay_type="cosine")

  config.log_training_steps = 2 if arg.runlocal else 50
  config.ckpt_steps = 3 if arg.runlocal else 200
  config.evals = ml_collections.ConfigDict()
  config.evals.test = dict(
      type="classification",
      data=dict(name="mnist5k", split="test"),
      pp_fn=recipes.MNIST_PP,
      batch_size=256 if not arg.runlocal else 16,
      log_percent=0.25,
  )
  # How ReLU attention behaves over training: sparsity, row sums, entropy, distance per layer.
  config.evals.attention = dict(
      type="attention_stats",
      data=dict(name="mnist5k", split="test"),
      pp_fn=recipes.MNIST_PP,
      batch_size=128 if not arg.runlocal else 16,
      num_examples=128 if not arg.runlocal else 16,
      log_percent=0.1,
  )
  # Few-shot transfer to scikit-learn's 8x8 digits (upsampled to MNIST's 28x28): the local
  # stand-in for the paper's "10-shot linear transfer" (closed-form ridge on pre_logits).
  config.evals.fewshot = recipes.fewshot_eval(recipes.DIGITS_FEWSHOT, size=28, channels=1,
                                              batch_size=256 if not arg.runlocal else 16,
                                              log_percent=0.5)
  return config
