"""The pp mini-language in JAX: the in-memory pipeline's preprocessing, run on the device.

The same pp strings as the tf.data ops (`pp/`, syntax in `pp_base`) and the same meaning, for
the ops below; images arrive decoded (uint8 [h, w, c], as `arrays` holds them), so `decode`
only sets the number of channels. Ops are written for one example and vmapped over a batch
(`batch_preprocess_fn`), inside a jitted function.

  decode(channels=3)          0: as stored; 1 or 3: keep, or grey -> RGB (decode's other
                              arguments mean nothing for decoded images and are ignored)
  resize(size, method='bilinear', antialias=False)    bilinear only
  central_crop(crop_size=None), random_crop(crop_size), flip_lr
  value_range(vmin=-1, vmax=1, in_min=0, in_max=255, clip_values=False)
  onehot(depth, key='label', key_result='labels', multi=True, on=1, off=0), keep(*keys),
  drop(*keys)
every image op with `key='image'`, as in `pp/`. Resizing keeps the dtype (clip, then truncate),
as there. Any other op raises ValueError naming these (use input.pipeline='tfds' for it).

Randomness: the random ops (`random_crop`, `flip_lr`) of an example draw from its key, which
`example_keys(seed, positions)` makes from the run's seed and the example's global position in
the data stream: fold_in(fold_in(fold_in(key(seed), 1), position_hi), position_lo), op number i
of the pp string folding in i. So an augmented example is a pure function of (seed, position),
as on the tf.data path (its per-example `_rng`), though the random numbers differ.
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
  if method != "bilinear":
    raise ValueError(f"resize: the in-memory pipeline resizes with method='bilinear' only, "
                     f"got {method!r}.")

  def apply(example: Example) -> Example:
    image = pp_base.get_key(example, key, "resize")
    resized = jax.image.resize(image.astype(jnp.float32), (height, width, image.shape[-1]),
                               "bilinear", antialias=antialias)
    info = jnp.iinfo(image.dtype) if jnp.issubdtype(image.dtype, jnp.integer) else None
    if info is not None:  # as tf.image.resize + clip + cast: truncates
      resized = jnp.clip(resized, info.min, info.max)
    return {**example, key: resized.astype(image.dtype)}
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
