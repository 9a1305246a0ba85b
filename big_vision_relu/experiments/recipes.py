"""Pieces shared by the configs in configs/: the paper's datasets, pp strings, evaluators, alpha
grid, and the `runlocal` shrink. (Config files are loaded by path, so they share code through
here.) Each config sets its own optimizer, schedule and cadence: its whole recipe on one page."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections

from big_vision_relu.data import holdout
from big_vision_relu.experiments.sweep import Grid

# The paper's 8 few-shot transfer datasets (10-shot linear probe, 3 seeds), for the `fewshot`
# evaluator: short name -> (TFDS name, train split, test split). Splits follow big_vision's
# public configs (uc_merced, colorectal_histology have only a train split).
FEWSHOT_8 = {
    "birds": ("caltech_birds2011", "train", "test"),
    "caltech": ("caltech101", "train", "test"),
    "cars": ("cars196", "train", "test"),
    "cifar100": ("cifar100", "train", "test"),
    "dtd": ("dtd", "train", "test"),
    "colhist": ("colorectal_histology", "train[:2000]", "train[2000:]"),
    "pets": ("oxford_iiit_pet", "train", "test"),
    "uc_merced": ("uc_merced", "train[:1000]", "train[1000:]"),
}

# variant -> (randaug magnitude or None, mixup p or None), from big_vision's vit_i21k.py.
I21K_AUGMENTATION = {
    "S/32": (None, None), "S/16": (0, None), "B/32": (10, 0.2), "B/16": (10, 0.2),
    "L/16": (15, 0.5),
    "S/8": (10, 0.2),  # ours: the paper does not say
}

# The alpha grid of the paper's Figures 2-4 (the paper gives none: its text says [0, 1], its
# plots run to 2): dense around the predicted optimum 1, both ends included.
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
ALPHA_SWEEP_VARIANTS = ("S/32", "S/16", "S/8")
# The paper's ImageNet-21k runs with every argument of Figures 1-4 spelled out, in one order
# (one run id per run, whichever figure lists it); Figures 3 and 4 are its ablations.
I21K_GRID = Grid("configs/vit_i21k.py", dict(variant="B/16", attention="relu", alpha=1.0,
                                             qk_norm=True, gated=False))

# Training split sizes of the recipes (TFDS), to turn epochs into steps without the data:
# fall-2011 ImageNet-21k minus the 51,200 held-out images; 99% of imagenet2012 train; the
# offline mnist5k's training split (configs/local, configs/repro); Fashion-MNIST's (configs/study).
TRAIN_SPLIT_SIZES = {
    ("imagenet21k", "full[51200:]"): 14_197_122 - 51_200,
    ("imagenet2012", "train[:99%]"): 1_268_355,
    ("mnist5k", "train"): 4_000,
    ("fashion_mnist_local", "train"): 60_000,
}


def train_split_size(data: Mapping[str, Any]) -> int | None:
  """The examples a training `data` spec reads (its holdout part, if any) from
  TRAIN_SPLIT_SIZES; None for a split not listed there."""
  size = TRAIN_SPLIT_SIZES.get((data.get("name"), data.get("split")))
  return None if size is None else holdout.part_size(size, data.get("holdout"))


def i21k_train_pp(variant: str, num_classes: int, size: int = 224) -> str:
  """Inception crop + flip (+ RandAugment by model size) as in the i21k recipe."""
  randaug, _ = I21K_AUGMENTATION.get(variant, (None, None))
  return (f"decode_jpeg_and_inception_crop({size})|flip_lr|"
          + (f"randaug(2, {randaug})|" if randaug is not None else "")
          + f'value_range(-1, 1)|onehot({num_classes})|keep("image", "labels")')


def eval_pp(num_classes: int, size: int = 224) -> str:
  """resize_small(256) + central_crop(224), the recipes' eval preprocessing."""
  return (f"decode|resize_small({size * 8 // 7})|central_crop({size})|value_range(-1, 1)|"
          f'onehot({num_classes})|keep("image", "labels")')


def fewshot_eval(datasets: dict, size: int, batch_size: int, *, channels: int = 3,
                 resize: int | None = None, **options: Any) -> dict:
  """The 10-shot, 3-seed linear probe on `datasets` ({name: (tfds, train, test)}); `options`
  are more keys of the evaluator (its cadence `log_steps=...`, `data_dir`); without a cadence
  it runs at the first and last step only.

  `resize`: squash to resize x resize, then take the central size x size crop, as big_vision's
  few-shot configs do (`resize(256)|central_crop(224)`: the paper's numbers depend on it);
  None squashes straight to `size` (the small offline datasets, whose images are that size).
  """
  if resize is not None and resize < size:
    raise ValueError(f"fewshot_eval: resize={resize} must be >= size={size} (the crop).")
  geometry = f"resize({size})" if resize is None else f"resize({resize})|central_crop({size})"
  pp = (f'decode(channels={channels})|{geometry}|value_range(-1, 1)|'
        'keep("image", "label")')
  return dict(type="fewshot", datasets=datasets, pp_train=pp, pp_eval=pp, shots=(10,),
              seeds=(0, 1, 2), batch_size=batch_size, **options)


# The offline MNIST recipes (configs/local, configs/repro): mnist5k's preprocessing, and the
# few-shot transfer to scikit-learn's 8x8 digits upsampled to MNIST's 28x28, the local stand-in
# for the paper's 10-shot linear transfer.
MNIST_PP = 'decode(channels=1)|value_range(-1, 1)|onehot(10)|keep("image", "labels")'
DIGITS_FEWSHOT = {"digits": ("digits", "train", "test")}


def local_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`runlocal`: the same recipe shrunk to the offline datasets (mnist5k, digits): minutes."""
  config.total_epochs = None
  config.total_steps = 20
  config.input.data = dict(name="mnist5k", split="train")
  config.input.batch_size = 32
  config.input.pp = MNIST_PP
  config.num_classes = 10
  config.model.variant = "mu/7"
  config.schedule.warmup_steps = 5
  config.log_training_steps = 5
  config.ckpt_steps = 10
  config.evals = ml_collections.ConfigDict({
      "test": dict(type="classification", data=dict(name="mnist5k", split="test[:256]"),
                   pp_fn=config.input.pp, batch_size=64, log_steps=10),
      "fewshot": fewshot_eval(DIGITS_FEWSHOT, size=28, batch_size=64, channels=1,
                              log_steps=20),
  })
  return config
