"""The pp mini-language in JAX: the in-memory pipeline's preprocessing, run on the device.

The same pp strings as the tf.data ops (`pp/`, syntax in `pp_base`) and the same meaning, for
the ops below; images arrive decoded (uint8 [h, w, c], as `arrays` holds them), so `decode`
only sets the number of channels. Ops are written for one example and vmapped over a batch
(`batch_preprocess_fn`), inside a jitted function.

  decode(channels=3)          0: as stored; 1 or 3: keep, or grey -> RGB (decode's other
                              arguments mean nothing for decoded images and are ignored)
  resize(size, method='bilinear', antialias=False)    bilinear only
  inception_crop(size, area_min=5, area_max=100, method='bilinear', antialias=False)
                              size required (the tf.data op's None, no resize, gives a shape
                              per example); bilinear only
  central_crop(crop_size=None), random_crop(crop_size), flip_lr
  value_range(vmin=-1, vmax=1, in_min=0, in_max=255, clip_values=False)
  onehot(depth, key='label', key_result='labels', multi=True, on=1, off=0), keep(*keys),
  drop(*keys)
every image op with `key='image'`, as in `pp/`. Resizing keeps the dtype (clip, then truncate),
as there. Any other op raises ValueError naming these (use input.pipeline='tfds' for it).

inception_crop: TF's box distribution (`_sample_box`), then the box resized in one step of
static shape (`crop_and_resize`): tf.image.resize of the box to float32 rounding. As uint8,
1.5% of the pixels (tests/test_jax_inception_crop.py) are one level off TF's: those whose exact
value is an integer, which float32 error in either resize puts just below it or not.

Randomness: the random ops (`inception_crop`, `random_crop`, `flip_lr`) of an example draw from
its key, which `example_keys(seed, positions)` makes from the run's seed and the example's
global position in the data stream: fold_in(fold_in(fold_in(key(seed), 1), position_hi),
position_lo), op number i of the pp string folding in i. So an augmented example is a pure
function of (seed, position), as on the tf.data path (its per-example `_rng`), though the random
numbers differ.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from big_vision_relu.data import pp_base

Example = dict[str, jax.Array]
_AUGMENT_STREAM = 1  # folded into the seed, as input_pipeline's augmentation stream
_CROP_ATTEMPTS = 100  # inception_crop's boxes: TF's default number of attempts


@dataclasses.dataclass(frozen=True)
class _Op:
  apply: Callable[..., Example]  # (example) -> example, or (example, key) -> example if random
  random: bool = False


_OPS: dict[str, Callable[..., _Op]] = {}


def _register(name: str):
  def decorator(factory):
    _OPS[name] = factory
    return factory
  return decorator


def _as_dtype(resized: jax.Array, dtype: jnp.dtype) -> jax.Array:
  """A float32 resized image back in its input dtype, as pp/ops_image's `_resize`: clipped to
  an integer dtype's range, then truncated."""
  if jnp.issubdtype(dtype, jnp.integer):
    resized = jnp.clip(resized, jnp.iinfo(dtype).min, jnp.iinfo(dtype).max)
  return resized.astype(dtype)


def _check_bilinear(method: str, op_name: str) -> None:
  if method != "bilinear":
    raise ValueError(f"{op_name}: the in-memory pipeline resizes with method='bilinear' only, "
                     f"got {method!r}.")


def _check_fits(image: jax.Array, size: tuple[int, int], op_name: str) -> None:
  if image.shape[0] < size[0] or image.shape[1] < size[1]:
    raise ValueError(f"pp op {op_name}: a {size} crop of an image of shape {image.shape}")


@_register("decode")
def _decode(channels: int = 3, precise: bool = False, *, key: str = "image") -> _Op:
  del precise  # how JPEGs are decoded: the images here are decoded already
  if channels not in (0, 1, 3):
    raise ValueError(f"decode: channels must be 0 (as stored), 1 or 3, got {channels}")

  def apply(example: Example) -> Example:
    image = pp_base.get_key(example, key, "decode")
    stored = image.shape[-1]
    if channels in (0, stored):
      return example
    if stored != 1:
      raise ValueError(f"decode(channels={channels}) of images with {stored} channels: the "
                       "in-memory pipeline turns grey into RGB only.")
    return {**example, key: jnp.broadcast_to(image, (*image.shape[:-1], channels))}
  return _Op(apply)


@_register("resize")
def _resize(size: int | tuple[int, int], method: str = "bilinear", antialias: bool = False, *,
            key: str = "image") -> _Op:
  height, width = pp_base.as_size(size, "resize")
  _check_bilinear(method, "resize")

  def apply(example: Example) -> Example:
    image = pp_base.get_key(example, key, "resize")
    resized = jax.image.resize(image.astype(jnp.float32), (height, width, image.shape[-1]),
                               "bilinear", antialias=antialias)
    return {**example, key: _as_dtype(resized, image.dtype)}
  return _Op(apply)


@_register("central_crop")
def _central_crop(crop_size: int | tuple[int, int] | None = None, *, key: str = "image") -> _Op:
  size = None if crop_size is None else pp_base.as_size(crop_size, "central_crop")

  def apply(example: Example) -> Example:
    image = pp_base.get_key(example, key, "central_crop")
    crop_h, crop_w = size or (min(image.shape[:2]),) * 2
    _check_fits(image, (crop_h, crop_w), "central_crop")
    top, left = (image.shape[0] - crop_h) // 2, (image.shape[1] - crop_w) // 2
    return {**example, key: image[top:top + crop_h, left:left + crop_w]}
  return _Op(apply)


@_register("random_crop")
def _random_crop(crop_size: int | tuple[int, int], *, key: str = "image") -> _Op:
  crop_h, crop_w = pp_base.as_size(crop_size, "random_crop")

  def apply(example: Example, rng: jax.Array) -> Example:
    image = pp_base.get_key(example, key, "random_crop")
    _check_fits(image, (crop_h, crop_w), "random_crop")
    rng_top, rng_left = jax.random.split(rng)
    top = jax.random.randint(rng_top, (), 0, image.shape[0] - crop_h + 1)
    left = jax.random.randint(rng_left, (), 0, image.shape[1] - crop_w + 1)
    crop = jax.lax.dynamic_slice(image, (top, left, 0), (crop_h, crop_w, image.shape[2]))
    return {**example, key: crop}
  return _Op(apply, random=True)


def _sample_box(rng: jax.Array, height: int, width: int, area_min: float, area_max: float
                ) -> jax.Array:
  """An inception crop's box of a [height, width] image: int32 [4] (top, left, box height,
  box width), as TF's `sample_distorted_bounding_box` draws it (pp/ops_image's `_crop_box`).

  TF tries up to 100 (aspect ratio, height, offset) draws one after the other and keeps the
  first valid box, else the whole image. Here the 100 candidates are drawn at once and the first
  valid one taken: the same distribution, a static shape. Per candidate, as TF's
  GenerateRandomCrop (float32, round half to even as its lrintf): aspect ratio r = w / h
  uniform in [0.75, 1.33); h uniform in [round(sqrt(min_area / r)), round(sqrt(max_area / r))],
  capped so round(h * r) <= width and h <= height; w = round(h * r); h one up if the area falls
  short, one down if it overshoots; valid if min_area <= h * w <= max_area and the box fits.
  Its top is uniform in [0, height - h), its left in [0, width - w) (TF's bounds: a box never
  touches the bottom or right edge unless it spans the image).
  """
  u_ratio, u_height, u_top, u_left = jax.random.uniform(rng, (4, _CROP_ATTEMPTS))
  min_area = np.float32(area_min / 100) * np.float32(width) * np.float32(height)
  max_area = np.float32(area_max / 100) * np.float32(width) * np.float32(height)
  ratio_min, ratio_max = np.float32(pp_base.CROP_RATIOS)
  ratio = u_ratio * (ratio_max - ratio_min) + ratio_min
  lo = jnp.round(jnp.sqrt(min_area / ratio))
  hi = jnp.round(jnp.sqrt(max_area / ratio))
  # The tallest box whose rounded width fits (TF divides in double, width + 0.5 - 1e-7).
  fit = jnp.floor((width + 0.5) / ratio)
  fit = jnp.where(jnp.round(fit * ratio) > width, fit - 1, fit)
  hi = jnp.minimum(jnp.where(jnp.round(hi * ratio) > width, fit, hi), height)
  lo = jnp.minimum(lo, hi)
  h = lo + jnp.floor(u_height * (hi - lo + 1))
  h = jnp.where(jnp.round(h * ratio) * h < min_area, h + 1, h)
  h = jnp.where(jnp.round(h * ratio) * h > max_area, h - 1, h)
  w = jnp.round(h * ratio)
  valid = ((h * w >= min_area) & (h * w <= max_area) & (h > 0) & (h <= height) & (w > 0)
           & (w <= width))
  top, left = jnp.floor(u_top * (height - h)), jnp.floor(u_left * (width - w))  # 0 if spanning
  first = jnp.argmax(valid)
  box = jnp.stack([top, left, h, w])[:, first].astype(jnp.int32)
  return jnp.where(valid[first], box, jnp.array([0, 0, height, width], jnp.int32))


def _box_weights(start: jax.Array, length: jax.Array, in_size: int, out_size: int,
                 antialias: bool) -> jax.Array:
  """Weights [out_size, in_size] that resize pixels [start, start + length) of an axis of
  in_size pixels to out_size, as tf.image.resize of the cropped axis: half-pixel centres, a
  triangle kernel (bilinear), widened by the downscaling factor if `antialias` (TF's
  ScaleAndTranslate), weights outside the box dropped and the rest renormalised. Without
  antialias that is TF's bilinear, edge pixels repeated past the box's edges.

  Not jax.image.scale_and_translate (the same weights, dynamic scale and translation): at the
  box's edges it reads the pixels outside the box, where TF's resize of the crop repeats the
  edge pixels (upscaled boxes differ in their outer rows and columns).
  """
  inv_scale = length.astype(jnp.float32) / out_size
  centres = (jnp.arange(out_size, dtype=jnp.float32) + 0.5) * inv_scale - 0.5  # in the box
  pixels = jnp.arange(in_size) - start  # in the box's coordinates
  kernel_scale = jnp.maximum(inv_scale, 1.0) if antialias else 1.0
  weights = jnp.maximum(0.0, 1.0 - jnp.abs(centres[:, None] - pixels) / kernel_scale)
  weights = jnp.where((pixels >= 0) & (pixels < length), weights, 0.0)
  return weights / jnp.sum(weights, axis=1, keepdims=True)


def crop_and_resize(image: jax.Array, box: jax.Array, size: tuple[int, int],
                    antialias: bool = False) -> jax.Array:
  """The box (top, left, height, width: int32 [4], traced) of image [H, W, C] resized to
  `size`, float32 [size[0], size[1], C]: tf.image.resize(image[top:top + height,
  left:left + width], size) in one static-shape step."""
  top, left, height, width = box
  rows = _box_weights(top, height, image.shape[0], size[0], antialias)
  cols = _box_weights(left, width, image.shape[1], size[1], antialias)
  # HIGHEST: no bf16/TF32 passes on accelerators, as in jax.image.resize.
  return jnp.einsum("yh,hwc,xw->yxc", rows, image.astype(jnp.float32), cols,
                    precision=jax.lax.Precision.HIGHEST)


@_register("inception_crop")
def _inception_crop(size: int | tuple[int, int] | None = None, area_min: float = 5,
                    area_max: float = 100, method: str = "bilinear", antialias: bool = False, *,
                    key: str = "image") -> _Op:
  if size is None:
    raise ValueError("inception_crop: the in-memory pipeline needs a size, e.g. "
                     "inception_crop(28): unresized crops differ in shape from example to "
                     "example, which a jitted batch cannot hold.")
  out_size = pp_base.as_size(size, "inception_crop")
  pp_base.check_area(area_min, area_max)
  _check_bilinear(method, "inception_crop")

  def apply(example: Example, rng: jax.Array) -> Example:
    image = pp_base.get_key(example, key, "inception_crop")
    box = _sample_box(rng, image.shape[0], image.shape[1], area_min, area_max)
    resized = crop_and_resize(image, box, out_size, antialias)
    return {**example, key: _as_dtype(resized, image.dtype)}
  return _Op(apply, random=True)


@_register("flip_lr")
def _flip_lr(*, key: str = "image") -> _Op:
  def apply(example: Example, rng: jax.Array) -> Example:
    image = pp_base.get_key(example, key, "flip_lr")
    return {**example, key: jnp.where(jax.random.bernoulli(rng), image[:, ::-1], image)}
  return _Op(apply, random=True)


@_register("value_range")
def _value_range(vmin: float = -1, vmax: float = 1, in_min: float | list[float] = 0,
                 in_max: float | list[float] = 255.0, clip_values: bool = False, *,
                 key: str = "image") -> _Op:
  lo, hi = np.asarray(in_min, np.float32), np.asarray(in_max, np.float32)
  if np.any(lo == hi):
    raise ValueError(f"value_range: in_min {in_min} and in_max {in_max} must differ")

  def apply(example: Example) -> Example:
    image = pp_base.get_key(example, key, "value_range").astype(jnp.float32)
    image = vmin + (image - lo) / (hi - lo) * (vmax - vmin)  # as pp/ops_image.py, op for op
    if clip_values:
      image = jnp.clip(image, min(vmin, vmax), max(vmin, vmax))
    return {**example, key: image}
  return _Op(apply)


@_register("onehot")
def _onehot(depth: int, key: str = "label", key_result: str = "labels", multi: bool = True,
            on: float = 1.0, off: float = 0.0) -> _Op:
  if not (isinstance(depth, int) and depth > 0):
    raise ValueError(f"onehot: depth must be a positive int, got {depth!r}")

  def apply(example: Example) -> Example:
    labels = pp_base.get_key(example, key, "onehot")
    if labels.ndim not in (0, 1):
      raise ValueError(f"onehot: {key!r} must be a scalar or a vector, got shape {labels.shape}")
    hot = labels[..., None] == jnp.arange(depth)
    if labels.ndim == 1 and multi:
      hot = jnp.any(hot, axis=0)
    return {**example, key_result: jnp.where(hot, jnp.float32(on), jnp.float32(off))}
  return _Op(apply)


@_register("keep")
def _keep(*keys: str) -> _Op:
  pp_base.check_keys("keep", keys)
  return _Op(lambda example: pp_base.keep(example, keys))


@_register("drop")
def _drop(*keys: str) -> _Op:
  pp_base.check_keys("drop", keys)
  return _Op(lambda example: pp_base.drop(example, keys))


def supported_ops() -> list[str]:
  return sorted(_OPS)


def _ops(pp: str) -> list[_Op]:
  ops = []
  for name, args, kwargs in pp_base.parse(pp):
    if name not in _OPS:
      raise ValueError(f"pp op {name!r} has no JAX version: the in-memory pipeline supports "
                       f"{', '.join(supported_ops())}; use input.pipeline='tfds' for {pp!r}.")
    try:
      ops.append(_OPS[name](*args, **kwargs))
    except TypeError as e:
      raise ValueError(f"pp op {name} rejected its arguments {args} {kwargs}: {e}") from None
  return ops


def example_keys(seed: int, positions: jax.Array) -> jax.Array:
  """Per-example PRNG keys [b] from the run's seed and positions uint32 [b, 2] (hi, lo words of
  each example's global position in the data stream)."""
  stream = jax.random.fold_in(jax.random.key(seed), _AUGMENT_STREAM)
  return jax.vmap(lambda p: jax.random.fold_in(jax.random.fold_in(stream, p[0]), p[1]))(
      positions)


def batch_preprocess_fn(pp: str, *, random: bool) -> Callable[..., Example]:
  """`pp` over a batch: `fn(batch, keys)` if `random` (keys from `example_keys`), else
  `fn(batch)`; batch: {key: [b, ...]}. Keys starting with '_' (`_mask`, `_record`,
  `_position`) pass through untouched. ValueError now for an unknown op, bad arguments, or a
  random op in a pp without keys (an eval pp)."""
  ops = _ops(pp)
  if not random and any(op.random for op in ops):
    raise ValueError(f"pp {pp!r} has random ops; evaluation pp strings must be deterministic.")

  def one(example: Example, rng: jax.Array | None) -> Example:
    for i, op in enumerate(ops):
      example = op.apply(example, jax.random.fold_in(rng, i)) if op.random else op.apply(example)
    return example

  def split(batch: Mapping[str, jax.Array]) -> tuple[Example, Example]:
    return ({k: v for k, v in batch.items() if not k.startswith("_")},
            {k: v for k, v in batch.items() if k.startswith("_")})

  if random:
    def apply_random(batch: Mapping[str, jax.Array], keys: jax.Array) -> Example:
      examples, passed = split(batch)
      return {**jax.vmap(one)(examples, keys), **passed}
    return apply_random

  def apply(batch: Mapping[str, jax.Array]) -> Example:
    examples, passed = split(batch)
    return {**jax.vmap(lambda e: one(e, None))(examples), **passed}
  return apply
