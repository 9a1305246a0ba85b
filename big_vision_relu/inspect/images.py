"""Images to run a model on: its own eval data (preprocessed as the run evaluates) or photos
prepared for its input."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from absl import logging
from etils import epath

from big_vision_relu.data import input_pipeline
from big_vision_relu.inspect.loading import Run


def input_shape(run: Run) -> tuple[int, int, int]:
  """(height, width, channels) of the model's input, read from its parameters.

  Channels come from the patch embedding; the size from a learned position embedding (a
  square grid of patches). With `posemb='sincos2d'` the size is not in the parameters: use
  the images of `eval_examples`.
  """
  embedding = run.params["embedding"]["kernel"]  # [ph, pw, channels, width]
  patch_h, patch_w, channels = embedding.shape[:3]
  if "pos_embedding" not in run.params:
    raise ValueError("This model's input size is not in its parameters (posemb="
                     f"{run.model.posemb!r}); take it from eval_examples' images.")
  tokens = run.params["pos_embedding"].shape[1]
  side = math.isqrt(tokens)
  if side * side != tokens:
    raise ValueError(f"pos_embedding has {tokens} tokens: not a square grid.")
  return side * patch_h, side * patch_w, int(channels)


def eval_examples(run: Run, num_examples: int = 16, *, data: Mapping[str, str] | None = None,
                  pp: str | None = None, data_dir: str | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
  """The first `num_examples` images of an eval split, preprocessed as the run evaluates.

  Args:
    run: a run from `load_run` (for an .npz run, pass `data` and `pp`).
    num_examples: how many (fewer if the split is smaller).
    data, pp: default: those of the run's first `classification` evaluator.
    data_dir: TFDS data dir; default: the config's, or TFDS's default if that directory does
      not exist here (e.g. a run trained elsewhere: the offline datasets build themselves).
  Returns:
    images `[n, h, w, c]` float32, labels `[n]` int (argmax of one-hot `labels`, or `label`).
  """
  if data is None or pp is None:
    evals = dict((run.config or {}).get("evals") or {})
    first = next((e for e in evals.values() if e.get("type") == "classification"), None)
    if first is None:
      raise ValueError("The run has no classification evaluator: pass data= and pp=.")
    data = dict(first["data"]) if data is None else data
    pp = first["pp_fn"] if pp is None else pp
  data = dict(data)
  if data_dir is not None:
    data["data_dir"] = data_dir
  elif data.get("data_dir") and not epath.Path(data["data_dir"]).exists():
    logging.warning("data_dir %s does not exist here; using TFDS's default.", data["data_dir"])
    data.pop("data_dir")
  batches = input_pipeline.eval_batches(data, pp, num_examples, process_index=0,
                                        process_count=1, prefetch=1)
  try:
    batch = next(batches)
  finally:
    batches.close()
  real = batch[input_pipeline.MASK_KEY]
  labels = batch["labels"].argmax(-1) if "labels" in batch else batch["label"]
  return batch["image"][real].astype(np.float32), np.asarray(labels)[real].astype(np.int64)


def sample_photos() -> dict[str, np.ndarray]:
  """scikit-learn's two sample photos {'china': [427, 640, 3], 'flower': ...} uint8 RGB."""
  from sklearn.datasets import load_sample_images
  bunch = load_sample_images()
  return {epath.Path(f).stem: image for f, image in zip(bunch.filenames, bunch.images)}


def photo_batch(photos: Sequence[np.ndarray], shape: tuple[int, int, int],
                value_range: tuple[float, float] = (-1.0, 1.0)) -> np.ndarray:
  """RGB uint8 photos `[H, W, 3]` -> model inputs `[n, h, w, c]` float32.

  Centre-crops each photo to the aspect ratio of `shape`, resizes it (antialiased), converts
  to grayscale (ITU-R 601 luma) when c == 1, and maps [0, 255] to `value_range` (the pp's
  `value_range(-1, 1)` of every config here). For a model trained on MNIST this is only a
  demonstration: a 28x28 grayscale photo is far from a handwritten digit.
  """
  from PIL import Image
  height, width, channels = shape
  out = []
  for photo in photos:
    rows, cols = photo.shape[:2]
    crop_cols = min(cols, round(rows * width / height))
    crop_rows = min(rows, round(cols * height / width))
    top, left = (rows - crop_rows) // 2, (cols - crop_cols) // 2
    image = Image.fromarray(photo[top:top + crop_rows, left:left + crop_cols])
    image = image.convert("L" if channels == 1 else "RGB")
    image = image.resize((width, height), Image.Resampling.LANCZOS)
    pixels = np.asarray(image, np.float32).reshape(height, width, channels) / 255.0
    lo, hi = value_range
    out.append(lo + (hi - lo) * pixels)
  return np.stack(out)
