r"""The Fashion-MNIST study's model and recipe (docs/reproduction.md): a small ViT, head dim 32.

One run (the study runs many, configs/study/fig*.py):

    python -m big_vision_relu.train \
        --config configs/study/fmnist_vit.py:patch=2,attention=relu,alpha=1 --workdir DIR

Arguments (`fmnist_vit.py:key=value,...`):
  size        Ti | S | B: Figure 1's model sizes (below)                              (Ti)
  patch       2 -> L = 196 patches (the /16 length, the main setting), 4 -> L = 49,
              7 -> L = 16 (the alpha-length study, docs/alpha_length.md)               (2)
  attention   softmax | relu | relu2 | gelu | softplus | identity | relu6 | sigmoid  (relu)
  alpha       seqlen_alpha: weights are L^-alpha * h(q.k/sqrt(d)), L = keys            (1.0)
  qk_norm     qk-layernorm                                                           (True)
  gated       the paper's gated attention                                            (False)
  epochs      passes over the 60,000 training images                                 (20)
  seed        run seed: init, data order, augmentation                               (0)
  lr          peak learning rate; the study's is fmnist.LR, 1e-3 or 2e-3 by its rule D2
              (docs/reproduction.md 1.2), spelled in run ids only when not 1e-3      (1e-3)
  batch, dtype_mm   batch size and matmul dtype: the study keeps them    (128, float32)
  flatten_tokens    the Dense layers on [batch * tokens, width]: bit-identical results, a
                    1.08x faster run on XLA:CPU (docs/benchmarks.md, 3); the study's runs
                    trained without it (pinned commit 8de55f7)                         (True)
  validation  0, or a validation split of this many training images (stratified, fixed by
              its own seed VALIDATION_SEED: data/holdout.py), held out of training and
              evaluated as `val` beside `test`: it selects checkpoints, the test split never
              selects anything                                                          (0)
  train_images  0, or train on this many of the images left after the validation split
              (stratified, nested as the size grows: data/holdout.py's rest_examples); needs
              validation (the alpha-length study's control (b), docs/alpha_length.md 7)    (0)
  eval_points evaluations of `test` (and `val`) per run, evenly spaced (plus the first and
              last step)                                                                (8)
  wd          decoupled weight decay (not multiplied by lr)                          (1e-4)
  crop        0, or `inception_crop(res, area_min=crop)` before the flip: a random box of
              crop..100% of the image, resized back to res x res (the alpha-length study's
              control (a), docs/alpha_length.md 7)                                       (0)
  runlocal    a few-step smoke run on slices of the data (used by the tests)        (False)
  input       tfds | memory: the input pipeline (config.input.pipeline); memory reads the
              IDX files into arrays and augments in JAX on the device, no TensorFlow
              (docs/gpu.md); same quality, another data order (docs/benchmarks.md)  (tfds)
  res         image side: 28 (the images' own) or more, resized bilinearly after decoding,
              in training and every evaluator (ViT-S/16 at 224: benchmarks/gpu_train.py) (28)

Sizes keep the head dimension at 32 and grow in width (depth 4, MLP 4x width):
  Ti: width 64, 2 heads (the main model);  S: 96, 3 heads;  B: 128, 4 heads.

With validation=5000, eval_points=20, epochs=40 (the alpha-length study, docs/alpha_length.md)
the run trains on the other 55,000 images and logs val/prec@1, val/loss beside test/prec@1,
test/loss at 21 points.

Expected (the study's runs, docs/reproduction.md 1): at L = 196 after 20 epochs, test accuracy
0.897-0.899 for relu/L (alpha 1) and 0.898-0.900 for softmax over seeds 0-2; 2.8-3.3 core hours a
run with tcmalloc preloaded (launch/study.sh), before flatten_tokens made runs 1.08x faster.
"""
import ml_collections

from big_vision_relu.experiments import recipes
from big_vision_relu.config import optional, parse_arg

HEAD_DIM = 32
SIZES = {"Ti": 64, "S": 96, "B": 128}  # size -> width; heads = width / HEAD_DIM
DATASET = "fashion_mnist_local"
SIDE = 28  # Fashion-MNIST's images are 28 x 28
TRAIN_PP = ('decode(channels=1)|{resize}{crop}flip_lr|value_range(-1, 1)|onehot(10)|'
            'keep("image", "labels")')
EVAL_PP = 'decode(channels=1)|{resize}value_range(-1, 1)|onehot(10)|keep("image", "labels")'
EPOCHS = 20
BATCH = 128
VALIDATION_SEED = 0  # the validation split's own seed: the same split for every run seed


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = parse_arg(arg, size="Ti", patch=2, attention="relu", alpha=1.0, qk_norm=True,
                  gated=False, epochs=EPOCHS, seed=0, runlocal=False, dtype_mm="float32",
                  batch=BATCH, lr=1e-3, flatten_tokens=True, validation=0, eval_points=8,
                  input="tfds", wd=1e-4, crop=0, res=SIDE, train_images=0)
  if arg.size not in SIZES:
    raise ValueError(f"size={arg.size!r}: expected one of {', '.join(SIZES)}.")
  if arg.res < SIDE:
    raise ValueError(f"res={arg.res}: the images are {SIDE} x {SIDE}; res upsamples them, so "
                     f"it must be >= {SIDE}.")
  if arg.res % arg.patch:
    raise ValueError(f"patch={arg.patch} must divide the {arg.res}-pixel side (res).")
  if not 0 <= arg.crop < 100:
    raise ValueError(f"crop={arg.crop}: the smallest crop's area in percent, 1-99, or 0 for "
                     "no crop.")
  if arg.train_images and not arg.validation:
    raise ValueError(f"train_images={arg.train_images} subsets what validation leaves for "
                     "training: set validation too (e.g. validation=5000).")
  if arg.train_images < 0:
    raise ValueError(f"train_images={arg.train_images}: a number of images, or 0 for all.")
  crop = f"inception_crop({arg.res}, area_min={arg.crop})|" if arg.crop else ""
  resize = f"resize({arg.res})|" if arg.res != SIDE else ""  # the study's pp has none
  eval_pp = EVAL_PP.format(resize=resize)
  width = SIZES[arg.size]
  config = ml_collections.ConfigDict()
  config.seed = arg.seed
  # Optional fields (placeholders): --config.total_epochs=None --config.total_steps=N works.
  config.total_epochs = optional(None if arg.runlocal else arg.epochs)
  config.total_steps = optional(4 if arg.runlocal else None)
  train_data = dict(name=DATASET, split="train" if not arg.runlocal else "train[:64]")
  holdout = None
  if arg.validation:
    holdout = dict(num_examples=arg.validation if not arg.runlocal else 16, seed=VALIDATION_SEED)
  rest = dict(holdout, part="rest") if holdout else None
  if arg.train_images:  # runlocal: 32 of its 48
    rest["rest_examples"] = arg.train_images if not arg.runlocal else 32
  config.input = dict(data=dict(train_data, holdout=rest) if holdout else train_data,
                      batch_size=arg.batch if not arg.runlocal else 16,
                      pp=TRAIN_PP.format(resize=resize, crop=crop))
  if arg.input != "tfds":  # unset for tfds: the study's workdirs hold configs without the key
    config.input.pipeline = arg.input
  config.num_classes = 10
  config.model = dict(
      patch_size=(arg.patch, arg.patch), width=width, depth=4, mlp_dim=4 * width,
      num_heads=width // HEAD_DIM, pool_type="gap", posemb="learn", dtype_mm=arg.dtype_mm,
      attention=arg.attention, seqlen_alpha=arg.alpha, qk_norm=arg.qk_norm, gated=arg.gated,
      flatten_tokens=arg.flatten_tokens,
  )
  config.loss = "softmax_xent"
  config.optax_name = "scale_by_adam"
  config.optax = dict(b1=0.9, b2=0.999)
  config.lr = arg.lr
  config.wd = arg.wd
  config.grad_clip_norm = 1.0
  config.schedule = dict(warmup_percent=0.05, decay_type="cosine")

  # XLA:CPU's YNNPACK fusions off: 1.5-1.8x faster steps for this model (docs/benchmarks.md).
  config.xla_compiler_options = {"xla_cpu_experimental_ynn_fusion_type": ""}

  config.log_training_steps = 2 if arg.runlocal else 100
  config.ckpt_steps = 2 if arg.runlocal else 500
  config.evals = ml_collections.ConfigDict()
  config.evals.test = dict(
      type="classification",
      data=dict(name=DATASET, split="test" if not arg.runlocal else "test[:32]"),
      pp_fn=eval_pp, batch_size=500 if not arg.runlocal else 16, log_percent=1 / arg.eval_points)
  if holdout:
    config.evals.val = dict(config.evals.test,
                            data=dict(train_data, holdout=dict(holdout, part="held_out")))
  # The paper's few-shot transfer, locally: 10-shot ridge probes of the representation on
  # mnist5k and on scikit-learn's 8x8 digits (upsampled to 28x28), 3 draws each.
  train, test = ("train", "test") if not arg.runlocal else ("train[:300]", "test[:100]")
  config.evals.fewshot = recipes.fewshot_eval(
      {"mnist5k": ("mnist5k", train, test), "digits": ("digits", train, test)},
      size=arg.res, channels=1, batch_size=500 if not arg.runlocal else 50, log_percent=0.25)
  # Sparsity, row sums, entropy and distance of each layer's attention over training.
  config.evals.attention = dict(
      type="attention_stats", data=dict(name=DATASET, split="test"), pp_fn=eval_pp,
      batch_size=128 if not arg.runlocal else 16, num_examples=128 if not arg.runlocal else 16,
      log_percent=0.25)
  return config
