"""Image pp ops. Every op reads and writes `key` (default 'image'), one example at a time.

Images are [height, width, channels]. Ops that change size keep the input dtype: images are
resized in float, clipped to the dtype's range and cast back (truncating, as big_vision does),
so `randaug` (uint8 only) can follow `inception_crop(224)` as in big_vision's configs.
`value_range` is the op that turns images into float32. Signatures follow big_vision's (same
positional order), plus `key`.

Random ops (`inception_crop`, `decode_jpeg_and_inception_crop`, `random_crop`, `flip_lr`) draw
from the example's `_rng` seed (see `common.take_seed`): same seed, same output.

Inception crop: a random box covering area_min..area_max percent of the image with aspect
ratio in [3/4, 4/3] (TF's `sample_distorted_bounding_box`, no minimum overlap, 100 attempts,
else the whole image), then an optional resize to `size`.
"""
import numpy as np
import tensorflow as tf

from big_vision_relu.data.pp.common import as_size, get_key, take_seed
from big_vision_relu.data.pp.registry import Example, PPFn, register
from big_vision_relu.data.pp_base import CROP_RATIOS, check_area


def _resize(image: tf.Tensor, size: tf.Tensor, method: str, antialias: bool) -> tf.Tensor:
  """Resizes [H, W, C] to `size` (int32 [2]), keeping the dtype (clip, then truncate)."""
  resized = tf.image.resize(image, size, method=method, antialias=antialias)
  return tf.cast(tf.clip_by_value(resized, image.dtype.min, image.dtype.max), image.dtype)


def _crop_box(image_shape: tf.Tensor, seed: tf.Tensor, area_min: float, area_max: float,
              ratio_min: float = CROP_RATIOS[0], ratio_max: float = CROP_RATIOS[1]
              ) -> tuple[tf.Tensor, tf.Tensor]:
  """Random inception-style box for an image of shape [H, W, C]: (begin [3], size [3])."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      image_shape, bounding_boxes=tf.zeros([1, 0, 4], tf.float32), seed=seed,
      min_object_covered=0, aspect_ratio_range=(ratio_min, ratio_max),
      area_range=(area_min / 100, area_max / 100), use_image_if_no_bounding_boxes=True)
  return begin, size


@register("decode")
def get_decode(channels: int = 3, precise: bool = False, *, key: str = "image") -> PPFn:
  """Decodes an encoded image (JPEG, PNG, GIF, BMP) string into uint8 [H, W, channels].

  channels=3 (default, like big_vision) also turns grayscale into RGB; channels=1 keeps or
  makes one channel; channels=0 keeps what the file stores. precise=True decodes JPEGs with
  the accurate integer DCT (as PIL does) instead of TF's faster default (JPEG/PNG only).
  """
  if channels not in (0, 1, 3):
    raise ValueError(f"decode: channels must be 0 (as stored), 1 or 3, got {channels}")

  def apply(example: Example) -> Example:
    data = get_key(example, key, "decode")
    if precise:
      image = tf.image.decode_jpeg(data, channels=channels, dct_method="INTEGER_ACCURATE")
    else:
      image = tf.io.decode_image(data, channels=channels, expand_animations=False,
                                 dtype=tf.uint8)
    return {**example, key: image}
  return apply


@register("decode_jpeg_and_inception_crop")
def get_decode_jpeg_and_inception_crop(size: int | tuple[int, int] | None = None,
                                       area_min: float = 5, area_max: float = 100,
                                       ratio_min: float = CROP_RATIOS[0],
                                       ratio_max: float = CROP_RATIOS[1],
                                       method: str = "bilinear", antialias: bool = False, *,
                                       key: str = "image") -> PPFn:
  """Inception crop decoded straight from JPEG bytes (only the box is decoded): uint8 RGB.

  Same distribution as `decode|inception_crop(...)` but faster; JPEG input only. The box's
  aspect ratio is in [ratio_min, ratio_max].
  """
  check_area(area_min, area_max)
  out_size = None if size is None else as_size(size, "decode_jpeg_and_inception_crop")

  def apply(example: Example) -> Example:
    example, seed = take_seed(example, "decode_jpeg_and_inception_crop")
    data = get_key(example, key, "decode_jpeg_and_inception_crop")
    begin, box = _crop_box(tf.image.extract_jpeg_shape(data), seed, area_min, area_max,
                           ratio_min, ratio_max)
    window = tf.stack([begin[0], begin[1], box[0], box[1]])
    image = tf.image.decode_and_crop_jpeg(data, window, channels=3)
    if out_size is not None:
      image = _resize(image, out_size, method, antialias)
    return {**example, key: image}
  return apply


@register("inception_crop")
def get_inception_crop(size: int | tuple[int, int] | None = None, area_min: float = 5,
                       area_max: float = 100, method: str = "bilinear",
                       antialias: bool = False, *, key: str = "image") -> PPFn:
  """Random box of area_min..area_max % of the image, then resize to `size` (if given)."""
  check_area(area_min, area_max)
  out_size = None if size is None else as_size(size, "inception_crop")

  def apply(example: Example) -> Example:
    example, seed = take_seed(example, "inception_crop")
    image = get_key(example, key, "inception_crop")
    begin, box = _crop_box(tf.shape(image), seed, area_min, area_max)
    image = tf.slice(image, begin, box)
    if out_size is not None:
      image = _resize(image, out_size, method, antialias)
    return {**example, key: image}
  return apply


@register("resize")
def get_resize(size: int | tuple[int, int], method: str = "bilinear",
               antialias: bool = False, *, key: str = "image") -> PPFn:
  """Resizes to `size` (int for square, or (height, width)), ignoring the aspect ratio."""
  out_size = as_size(size, "resize")

  def apply(example: Example) -> Example:
    image = _resize(get_key(example, key, "resize"), out_size, method, antialias)
    return {**example, key: image}
  return apply


@register("resize_small")
def get_resize_small(smaller_size: int, method: str = "area", antialias: bool = False, *,
                     key: str = "image") -> PPFn:
  """Resizes so the shorter side is `smaller_size`, keeping the aspect ratio.

  The longer side becomes round(longer * smaller_size / shorter) (in float32, as big_vision).
  """
  as_size(smaller_size, "resize_small")  # Validates: a positive int.

  def apply(example: Example) -> Example:
    image = get_key(example, key, "resize_small")
    hw = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = smaller_size / tf.reduce_min(hw)
    new_hw = tf.cast(tf.round(hw * scale), tf.int32)
    return {**example, key: _resize(image, new_hw, method, antialias)}
  return apply


@register("central_crop")
def get_central_crop(crop_size: int | tuple[int, int] | None = None, *,
                     key: str = "image") -> PPFn:
  """Crops the central (height, width) window, or the largest central square if None.

  Offsets round down: (H - h) // 2.
  """
  size = None if crop_size is None else as_size(crop_size, "central_crop")

  def apply(example: Example) -> Example:
    image = get_key(example, key, "central_crop")
    shape = tf.shape(image)
    crop_h, crop_w = size or (tf.reduce_min(shape[:2]),) * 2
    top, left = (shape[0] - crop_h) // 2, (shape[1] - crop_w) // 2
    # Fails at run time (negative offset) if the image is smaller than the crop.
    crop = tf.image.crop_to_bounding_box(image, top, left, crop_h, crop_w)
    return {**example, key: crop}
  return apply


@register("random_crop")
def get_random_crop(crop_size: int | tuple[int, int], *, key: str = "image") -> PPFn:
  """Crops a uniformly random (height, width) window."""
  crop_h, crop_w = as_size(crop_size, "random_crop")

  def apply(example: Example) -> Example:
    example, seed = take_seed(example, "random_crop")
    image = get_key(example, key, "random_crop")
    crop = tf.image.stateless_random_crop(
        image, tf.stack([crop_h, crop_w, tf.shape(image)[2]]), seed)
    # The crop size is known; say so, so that batching sees a fixed shape.
    return {**example, key: tf.ensure_shape(crop, [crop_h, crop_w, image.shape[2]])}
  return apply


@register("flip_lr")
def get_flip_lr(*, key: str = "image") -> PPFn:
  """Mirrors the image left-right with probability 1/2."""
  def apply(example: Example) -> Example:
    example, seed = take_seed(example, "flip_lr")
    image = tf.image.stateless_random_flip_left_right(get_key(example, key, "flip_lr"), seed)
    return {**example, key: image}
  return apply


@register("value_range")
def get_value_range(vmin: float = -1, vmax: float = 1, in_min: float | list[float] = 0,
                    in_max: float | list[float] = 255.0, clip_values: bool = False, *,
                    key: str = "image") -> PPFn:
  """Maps [in_min, in_max] linearly onto [vmin, vmax] as float32 (optionally clipped).

  in_min / in_max may be per-channel lists.
  """
  if np.any(np.asarray(in_max, np.float32) == np.asarray(in_min, np.float32)):
    raise ValueError(f"value_range: in_min {in_min} and in_max {in_max} must differ")

  def apply(example: Example) -> Example:
    image = tf.cast(get_key(example, key, "value_range"), tf.float32)
    lo, hi = tf.constant(in_min, tf.float32), tf.constant(in_max, tf.float32)
    image = vmin + (image - lo) / (hi - lo) * (vmax - vmin)
    if clip_values:
      image = tf.clip_by_value(image, min(vmin, vmax), max(vmin, vmax))
    return {**example, key: image}
  return apply
