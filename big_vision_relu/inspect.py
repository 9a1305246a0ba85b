"""What did the attention learn? Load a run, look at its attention maps and statistics.

    from big_vision_relu import inspect
    run = inspect.load_run("workdirs/mnist_relu")             # newest checkpoint (or step=...)
    images, labels = inspect.eval_examples(run, 16)           # the run's own eval data and pp
    out = inspect.run_model(run, images)                      # logits, weights, q, k, residual
    out.weights[layer]                                        # [n, heads, q_len, k_len]
    inspect.attention_statistics(out.weights, out.grid_shape, out.num_prefix_tokens)
    inspect.qk_logit_norms(out.queries, out.keys)
    inspect.attention_shares(out.attention_outputs, out.block_inputs)  # |attention| / |input|

`load_npz(path, model_config)` does the same for a big_vision `.npz`. Weights are those the
encoder blocks really use (sown by the model: `vit.Model(..., sow_attention_weights=True)`),
for every activation of the family and for `scan=True` models (split into layers here).

The statistics are pure functions of arrays (numpy in float64 here; `row_statistics` is also
traceable with jax, for the `attention_stats` evaluator that logs a light version during
training). Per row (one query of one head) of weights `w` over the `K` keys:

    zeros      how many w == 0 exactly (ReLU sparsity); negatives: how many w < 0
    row_sum    sum_k w (softmax: 1; relu/L: how close L^-1 sum relu(s) comes to 1)
    entropy    -sum_k p log p (nats) of the ROW-NORMALISED MAGNITUDES p = |w| / sum|w|: the
               pointwise family's rows are not distributions (and gelu/identity can be
               negative), so the entropy describes the shape of a row, its sum is reported
               separately. Uniform over K keys: log K. Undefined (excluded) for all-zero rows.
    distance   mean attention distance (as in Dosovitskiy et al.): sum_j p_j |pos_q - pos_j|
               in PATCH units (x patch size for pixels) on the patch grid, with p the row's
               magnitudes renormalised over the PATCH keys. Prefix tokens (the class token of
               pool_type='tok') are excluded as queries and as keys.

Layer aggregates are over all rows of all images and heads (or per head): fractions of zeros
and negatives over all entries, `dead_rows` (rows that are all zero), the row-sum
distribution (mean, std, min, p05, p50, p95, max), mean entropy over non-dead rows, mean
distance over patch queries with a non-zero patch row.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from etils import epath
from flax import traverse_util

from big_vision_relu import metrics as metrics_lib
from big_vision_relu.models import vit

Array = Any  # np.ndarray or jax.Array: the row statistics run on either

# Paths (in the model's `intermediates`) of the encoder's attention weights and q/k inputs of
# the scores; `encoderblock_<i>` per layer, `encoderblock` (leading depth axis) with scan.
_ATTENTION = r"Transformer/encoderblock(?:_(\d+))?/MultiHeadDotProductAttention_0/"
_WEIGHTS = re.compile(_ATTENTION + r"attention_weights$")
_QK = re.compile(_ATTENTION + r"(query|key|query_ln|key_ln)/__call__$")
_QK_MODULES = ("query", "key", "query_ln", "key_ln")


# ----------------------------------------------------------------------------- loading

@dataclasses.dataclass(frozen=True)
class Run:
  """A model with its parameters: a training run's checkpoint or a big_vision `.npz`."""
  model: vit._Model  # noqa: SLF001
  params: Any  # nested dict of arrays (scan layout if model.scan)
  config: ml_collections.ConfigDict | None  # the run's config.json (None for an .npz)
  step: int | None  # the checkpoint's step (None for an .npz)
  source: str  # the workdir or .npz path

  @property
  def name(self) -> str:
    """A short label for tables and figures: the workdir's (or file's) name."""
    return epath.Path(self.source).name

  @functools.cached_property
  def forward(self) -> Callable[[Any, jax.Array], dict[str, Any]]:
    """`apply_inspecting` of this run's model, jitted: (params, images) -> dict."""
    return jax.jit(functools.partial(apply_inspecting, self.model))


def checkpoint_steps(workdir: str | epath.PathLike) -> list[int]:
  """The finalised checkpoint steps of a workdir, ascending (orbax writes a step atomically)."""
  directory = epath.Path(workdir) / "checkpoints"
  if not directory.exists():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def load_run(workdir: str | epath.PathLike, step: int | None = None) -> Run:
  """Loads a training workdir: `config.json`, the model it describes and a checkpoint's params.

  Args:
    workdir: the `--workdir` of `big_vision_relu.train` (local or gs://).
    step: the checkpoint step; None: the newest readable one (an unreadable newer step is
      skipped with a warning; nothing on disk is changed).
  """
  # Imported here: the trainer imports this module (through the attention_stats evaluator),
  # and orbax (checkpoint) is a slow import needed only here.
  from big_vision_relu import checkpoint as checkpoint_lib
  from big_vision_relu import evaluate as evaluate_lib
  from big_vision_relu import run as run_lib
  config = evaluate_lib.load_run_config(str(workdir))
  model = run_lib.make_model(config)
  steps = checkpoint_steps(workdir)
  if step is not None and step not in steps:
    raise FileNotFoundError(f"No checkpoint step {step} in {workdir}/checkpoints; steps: "
                            f"{steps or 'none'}.")
  candidates = [step] if step is not None else steps[::-1]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  errors = []
  for candidate in candidates:
    try:
      params = checkpoint_lib.read_state(epath.Path(workdir) / "checkpoints" / str(candidate),
                                         device)["params"]
    except (ValueError, OSError) as e:
      if step is not None:
        raise
      logging.warning("Could not read checkpoint step %d of %s (%s); trying an older one.",
                      candidate, workdir, e)
      errors.append(f"step {candidate}: {type(e).__name__}: {e}")
      continue
    return Run(model=model, params=params, config=config, step=candidate, source=str(workdir))
  raise FileNotFoundError(f"No readable checkpoint in {workdir}/checkpoints"
                          + (":\n" + "\n".join(errors) if errors else " (none written yet)."))


def load_npz(path: str, model_config: Mapping[str, Any], num_classes: int | None = None) -> Run:
  """Loads a big_vision-layout `.npz` for the ViT of `model_config` (`config.model` keywords).

  Args:
    path: local or gs:// `.npz` (e.g. one of big_vision's released ViTs, or `vit.save_npz`).
    model_config: keywords of `vit.Model`, e.g. {'variant': 'S/16', 'pool_type': 'map'}.
    num_classes: the head's classes; None: read from the file's `head/kernel` (no head: None).
  """
  model_config = dict(model_config)
  params = vit.load(None, path, model_config)
  if num_classes is None and "head" in params:
    num_classes = int(params["head"]["kernel"].shape[-1])
  model = vit.Model(num_classes, **model_config)
  model.validate()
  return Run(model=model, params=params, config=None, step=None, source=str(path))


def read_metrics(workdir: str | epath.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """`<workdir>/metrics.jsonl` as {metric: (steps [m] int, values [m] float)}, by step (read by
  `metrics.read_metrics`, which keeps the surviving run's lines of a resumed run)."""
  series: dict[str, tuple[list[int], list[float]]] = {}
  for step, record in metrics_lib.read_metrics(workdir).items():
    for name, value in record.items():
      steps, values = series.setdefault(name, ([], []))
      steps.append(step)
      values.append(float(value))
  return {name: (np.asarray(s), np.asarray(v)) for name, (s, v) in series.items()}


# ----------------------------------------------------------------------------- inputs

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
  from big_vision_relu.data import input_pipeline  # imports TensorFlow
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


# ----------------------------------------------------------------------------- the model

@dataclasses.dataclass(frozen=True)
class TokenLayout:
  """How the encoder's tokens map to the image: `num_prefix_tokens` (class token), then the
  patches of a `grid_shape` = (rows, cols) grid in row-major order."""
  grid_shape: tuple[int, int]
  num_prefix_tokens: int


def token_layout(model: vit._Model, image_hw: tuple[int, int]) -> TokenLayout:  # noqa: SLF001
  """The token layout of `model` for `[height, width]` images."""
  patch_h, patch_w = model.patch_size
  return TokenLayout(grid_shape=(image_hw[0] // patch_h, image_hw[1] // patch_w),
                     num_prefix_tokens=1 if model.pool_type == "tok" else 0)


def apply_inspecting(model: vit._Model, params: Any, images: jax.Array, *,  # noqa: SLF001
                     with_qk: bool = True) -> dict[str, Any]:
  """One eval-mode forward pass that also returns what the attention did (jax-traceable).

  Args:
    model: the ViT. Its `sow_attention_weights` is switched on here, and its attention runs
      dense: the blockwise implementations (`attention_impl` chunked, seq_parallel, pallas)
      compute the same function from the same parameters but never hold the weights.
    params: its parameters.
    images: `[n, h, w, c]`.
    with_qk: also capture the queries and keys entering the scores (after qk-LN, if any).
  Returns:
    {'logits': `[n, ...]` (the model's output), 'weights': per layer `[n, heads, q, k]`,
    'attention_outputs': per layer the attention branch `[n, tokens, width]` (what the block
    adds to its input), 'block_inputs': per layer the residual stream entering the block
    `[n, tokens, width]`, and with_qk 'queries': per layer `[n, q, heads, head_dim]`, 'keys':
    `[n, k, heads, d]`}. Unused outputs cost nothing under jit (XLA drops them).
  """
  def capture(module: nn.Module, method: str) -> bool:
    return with_qk and method == "__call__" and module.name in _QK_MODULES

  model = model.clone(sow_attention_weights=True, attention_impl="dense")
  (logits, aux), state = model.apply(
      {"params": params}, images, train=False, mutable=["intermediates"],
      capture_intermediates=capture)
  found: dict[str, dict[int, jax.Array]] = {}
  for path, sown in traverse_util.flatten_dict(state["intermediates"], sep="/").items():
    (value,) = sown  # sow keeps a tuple of the values sown (one call each here)
    if match := _WEIGHTS.match(path):
      name, layer = "weights", match.group(1)
    elif match := _QK.match(path):
      name, layer = match.group(2), match.group(1)
    else:
      continue
    if layer is None:  # scanned: a leading depth axis
      found.setdefault(name, {}).update(enumerate(value))
    else:
      found.setdefault(name, {})[int(layer)] = value
  as_list = lambda name: [found[name][i] for i in range(len(found[name]))]  # noqa: E731
  blocks = [aux["encoder"][f"block{layer:02d}"] for layer in range(model.depth)]
  out = {"logits": logits, "weights": as_list("weights"),
         "attention_outputs": [block["sa"] for block in blocks],
         # The block's input is not kept by the model; its sum with the branch ("+sa") is.
         "block_inputs": [block["+sa"] - block["sa"] for block in blocks]}
  if with_qk:
    # With qk-LN the scores use the normalised q and k.
    out["queries"] = as_list("query_ln" if "query_ln" in found else "query")
    out["keys"] = as_list("key_ln" if "key_ln" in found else "key")
  return out


@dataclasses.dataclass(frozen=True)
class Inspection:
  """A forward pass over some images, as numpy arrays (see `apply_inspecting`)."""
  logits: np.ndarray  # [n, classes]
  weights: list[np.ndarray]  # per layer [n, heads, q, k]
  queries: list[np.ndarray]  # per layer [n, q, heads, head_dim]
  keys: list[np.ndarray]  # per layer [n, k, heads, head_dim]
  attention_outputs: list[np.ndarray]  # per layer [n, tokens, width]
  block_inputs: list[np.ndarray]  # per layer [n, tokens, width]
  grid_shape: tuple[int, int]
  num_prefix_tokens: int

  def select(self, index: Any) -> Inspection:
    """The inspection of some of the images: `index` as for numpy (slice, indices, mask)."""
    pick = lambda arrays: [a[index] for a in arrays]  # noqa: E731
    return dataclasses.replace(self, logits=self.logits[index], weights=pick(self.weights),
                               queries=pick(self.queries), keys=pick(self.keys),
                               attention_outputs=pick(self.attention_outputs),
                               block_inputs=pick(self.block_inputs))


def run_model(run: Run, images: np.ndarray, batch_size: int = 64) -> Inspection:
  """Runs `images` `[n, h, w, c]` (already preprocessed) through the run's model, in batches.

  Batches have min(n, batch_size) images, the last one padded: one compilation per call.
  """
  if images.ndim != 4 or not len(images):
    raise ValueError(f"images must be [n > 0, height, width, channels], got {images.shape}.")
  batch = min(len(images), batch_size)
  parts = []
  for start in range(0, len(images), batch):
    chunk = images[start:start + batch]
    padded = np.concatenate([chunk, np.zeros((batch - len(chunk), *chunk.shape[1:]),
                                             chunk.dtype)])
    out = jax.device_get(run.forward(run.params, jnp.asarray(padded)))
    parts.append(jax.tree.map(lambda x, n=len(chunk): x[:n], out))
  joined = jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
  layout = token_layout(run.model, images.shape[1:3])
  return Inspection(logits=joined["logits"], weights=joined["weights"],
                    queries=joined["queries"], keys=joined["keys"],
                    attention_outputs=joined["attention_outputs"],
                    block_inputs=joined["block_inputs"],
                    grid_shape=layout.grid_shape, num_prefix_tokens=layout.num_prefix_tokens)


def attention_maps(run: Run, images: np.ndarray, batch_size: int = 64) -> list[np.ndarray]:
  """The attention weights of every encoder layer, `[n, heads, q_len, k_len]` each."""
  return run_model(run, images, batch_size).weights


# ----------------------------------------------------------------------------- statistics

def _namespace(x: Array) -> Any:
  return jnp if isinstance(x, jax.Array) else np


def infer_layout(k_len: int, grid_shape: tuple[int, int] | None = None,
                 num_prefix_tokens: int | None = None) -> TokenLayout:
  """The token layout of `k_len` tokens: given, or inferred for a square grid (k_len = s^2
  without a prefix token, or s^2 + 1 with a class token)."""
  if grid_shape is None:
    prefixes = [num_prefix_tokens] if num_prefix_tokens is not None else [0, 1]
    for prefix in prefixes:
      side = math.isqrt(max(k_len - prefix, 0))
      if side > 0 and side * side == k_len - prefix:
        return TokenLayout((side, side), prefix)
    raise ValueError(f"Cannot infer a square patch grid from {k_len} tokens; pass grid_shape.")
  prefix = k_len - grid_shape[0] * grid_shape[1]
  if prefix < 0 or (num_prefix_tokens is not None and prefix != num_prefix_tokens):
    raise ValueError(f"{k_len} tokens do not fit a {grid_shape} grid plus "
                     f"{num_prefix_tokens} prefix tokens.")
  return TokenLayout(tuple(grid_shape), prefix)


def patch_distances(grid_shape: tuple[int, int]) -> np.ndarray:
  """Euclidean distances `[P, P]` between the patches of a row-major grid, in patch units."""
  rows, cols = np.divmod(np.arange(grid_shape[0] * grid_shape[1]), grid_shape[1])
  return np.hypot(rows[:, None] - rows[None, :], cols[:, None] - cols[None, :])


def row_statistics(weights: Array, grid_shape: tuple[int, int] | None = None,
                   num_prefix_tokens: int | None = None) -> dict[str, Array]:
  """Per-row statistics of attention weights (numpy, or jax when `weights` is a jax array).

  Args:
    weights: `[..., q_len, k_len]` self-attention weights (q_len == k_len tokens: prefix
      tokens first, then the patches of the grid in row-major order).
    grid_shape, num_prefix_tokens: the token layout (see `infer_layout`).
  Returns:
    Arrays `[..., q_len]`: 'zeros' and 'negatives' (counts over the row), 'row_sum',
    'entropy' (of the row-normalised magnitudes, nats; 0 where undefined), 'live' (1 where
    the row is not all zero: entropy defined), 'distance' (mean attention distance in
    patches; 0 where undefined), 'distance_valid' (1 for patch queries with a non-zero
    patch row). See the module docstring for the definitions.
  """
  xp = _namespace(weights)
  q_len, k_len = weights.shape[-2:]
  layout = infer_layout(k_len, grid_shape, num_prefix_tokens)
  prefix = layout.num_prefix_tokens
  if q_len != k_len:
    raise ValueError(f"Self-attention weights expected, got q_len={q_len}, k_len={k_len}.")
  dtype = weights.dtype if xp is jnp else np.float64
  weights = weights.astype(dtype)
  magnitude = xp.abs(weights)

  def normalised(m):
    mass = m.sum(-1, keepdims=True)
    return m / xp.where(mass > 0, mass, 1.0), (mass[..., 0] > 0).astype(dtype)

  p, live = normalised(magnitude)
  entropy = -(xp.where(p > 0, p * xp.log(xp.where(p > 0, p, 1.0)), 0.0)).sum(-1)

  patch_p, patch_live = normalised(magnitude[..., prefix:, prefix:])
  distance = (patch_p * patch_distances(layout.grid_shape).astype(dtype)).sum(-1)
  pad = [(0, 0)] * (weights.ndim - 2) + [(prefix, 0)]
  return {
      "zeros": (weights == 0).sum(-1).astype(dtype),
      "negatives": (weights < 0).sum(-1).astype(dtype),
      "row_sum": weights.sum(-1),
      "entropy": entropy,
      "live": live,
      "distance": xp.pad(distance, pad),
      "distance_valid": xp.pad(patch_live, pad),
  }


STAT_NAMES = ("zeros", "negatives", "dead_rows", "row_sum_mean", "row_sum_std", "row_sum_min",
              "row_sum_p05", "row_sum_p50", "row_sum_p95", "row_sum_max", "entropy", "distance")


def _aggregate(rows: dict[str, np.ndarray], k_len: int, by_head: bool) -> dict[str, np.ndarray]:
  """Per-row statistics `[n, heads, q]` -> per head `[heads]` (by_head) or per layer `[1]`."""
  def groups(x):  # [groups, rows of the group]
    return np.moveaxis(x, 1, 0).reshape(x.shape[1], -1) if by_head else x.reshape(1, -1)
  g = {name: groups(value) for name, value in rows.items()}

  def mean_where(values, valid):
    count = valid.sum(1)
    return np.where(count > 0, (values * valid).sum(1) / np.maximum(count, 1), np.nan)
  p05, p50, p95 = np.percentile(g["row_sum"], [5, 50, 95], axis=1)
  return {
      "zeros": g["zeros"].mean(1) / k_len,
      "negatives": g["negatives"].mean(1) / k_len,
      "dead_rows": 1.0 - g["live"].mean(1),
      "row_sum_mean": g["row_sum"].mean(1),
      "row_sum_std": g["row_sum"].std(1),
      "row_sum_min": g["row_sum"].min(1),
      "row_sum_p05": p05,
      "row_sum_p50": p50,
      "row_sum_p95": p95,
      "row_sum_max": g["row_sum"].max(1),
      "entropy": mean_where(g["entropy"], g["live"]),
      "distance": mean_where(g["distance"], g["distance_valid"]),
  }


def attention_statistics(weights_per_layer: Sequence[Array],
                         grid_shape: tuple[int, int] | None = None,
                         num_prefix_tokens: int | None = None, *,
                         by_head: bool = False) -> list[dict[str, float]]:
  """Statistics of each layer's attention weights (definitions: the module docstring).

  Args:
    weights_per_layer: per layer `[n, heads, q, k]` (e.g. `Inspection.weights`).
    grid_shape, num_prefix_tokens: the token layout (default: inferred, see `infer_layout`).
    by_head: one row per (layer, head) instead of per layer.
  Returns:
    Table rows: {'layer': i, ('head': h,) **{name: value for name in STAT_NAMES}}, floats
    (NaN where a statistic has no valid row, e.g. the entropy of an all-zero layer).
  """
  table = []
  for layer, layer_weights in enumerate(weights_per_layer):
    weights = np.asarray(layer_weights, np.float64)
    if weights.ndim != 4:
      raise ValueError(f"layer {layer}: expected [n, heads, q, k], got {weights.shape}.")
    rows = row_statistics(weights, grid_shape, num_prefix_tokens)
    stats = _aggregate(rows, weights.shape[-1], by_head)
    for group in range(weights.shape[1] if by_head else 1):
      table.append({"layer": layer, **({"head": group} if by_head else {}),
                    **{name: float(value[group]) for name, value in stats.items()}})
  return table


QK_STAT_NAMES = ("query_norm_mean", "query_norm_max", "key_norm_mean", "key_norm_max",
                 "logit_mean", "logit_std", "logit_max_abs")


def qk_logit_norms(queries_per_layer: Sequence[Array],
                   keys_per_layer: Sequence[Array]) -> list[dict[str, float]]:
  """Sizes of what enters the attention scores, per layer (the paper's logit growth check).

  Args:
    queries_per_layer: per layer `[n, q, heads, head_dim]` (after qk-LN if the model has it;
      `Inspection.queries`).
    keys_per_layer: per layer `[n, k, heads, head_dim]`.
  Returns:
    Table rows {'layer', 'query_norm_mean', 'query_norm_max', 'key_norm_mean', 'key_norm_max'
    (L2 norms over head_dim of every token and head), 'logit_mean', 'logit_std',
    'logit_max_abs' (of the scores q.k / sqrt(head_dim) over all images, heads, q and k)}.
  """
  table = []
  for layer, (q, k) in enumerate(zip(queries_per_layer, keys_per_layer, strict=True)):
    queries, keys = np.asarray(q, np.float64), np.asarray(k, np.float64)
    q_norm, k_norm = np.linalg.norm(queries, axis=-1), np.linalg.norm(keys, axis=-1)
    logits = np.einsum("nqhd,nkhd->nhqk", queries, keys) / np.sqrt(queries.shape[-1])
    table.append({"layer": layer,
                  "query_norm_mean": float(q_norm.mean()), "query_norm_max": float(q_norm.max()),
                  "key_norm_mean": float(k_norm.mean()), "key_norm_max": float(k_norm.max()),
                  "logit_mean": float(logits.mean()), "logit_std": float(logits.std()),
                  "logit_max_abs": float(np.abs(logits).max())})
  return table


def attention_shares(attention_outputs: Sequence[Array],
                     block_inputs: Sequence[Array]) -> list[dict[str, float]]:
  """How much each layer's attention changes the residual stream.

  Args:
    attention_outputs: per layer the attention branch `[n, tokens, width]`
      (`Inspection.attention_outputs`).
    block_inputs: per layer the residual stream it is added to `[n, tokens, width]`.
  Returns:
    Table rows {'layer', 'attention_to_residual': the mean over images and tokens of
    |branch| / |input| (L2 norms over width)}. Near 0: the layer's attention hardly mixes the
    tokens (e.g. a large L^-alpha the model did not make up for).
  """
  table = []
  for layer, (branch, stream) in enumerate(zip(attention_outputs, block_inputs, strict=True)):
    ratio = (np.linalg.norm(np.asarray(branch, np.float64), axis=-1)
             / np.linalg.norm(np.asarray(stream, np.float64), axis=-1))
    table.append({"layer": layer, "attention_to_residual": float(ratio.mean())})
  return table


def layer_table(inspection: Inspection) -> list[dict[str, float]]:
  """`attention_statistics`, `qk_logit_norms` and `attention_shares` of an inspection, one
  row per layer."""
  stats = attention_statistics(inspection.weights, inspection.grid_shape,
                               inspection.num_prefix_tokens)
  norms = qk_logit_norms(inspection.queries, inspection.keys)
  shares = attention_shares(inspection.attention_outputs, inspection.block_inputs)
  return [{**s, **n, **a} for s, n, a in zip(stats, norms, shares, strict=True)]


def received_attention(weights: Array, grid_shape: tuple[int, int] | None = None,
                       num_prefix_tokens: int | None = None) -> np.ndarray:
  """Where a layer looks, as an image: `[n, heads, q, k]` -> `[n, rows, cols]`.

  The row-normalised magnitudes (as for the entropy) of the patch queries, restricted to the
  patch keys and renormalised, averaged over queries and heads: the share of the layer's
  attention that each patch receives (sums to 1 over the grid; uniform = 1 / P).
  """
  weights = np.abs(np.asarray(weights, np.float64))
  layout = infer_layout(weights.shape[-1], grid_shape, num_prefix_tokens)
  prefix = layout.num_prefix_tokens
  patch = weights[..., prefix:, prefix:]
  mass = patch.sum(-1, keepdims=True)
  p = patch / np.where(mass > 0, mass, 1.0)
  live = (mass > 0).astype(np.float64)
  received = p.sum((1, 2)) / np.maximum(live.sum((1, 2)), 1.0)
  return received.reshape(-1, *layout.grid_shape)
