"""RandAugment (Cubuk et al., 2019) in core TensorFlow ops: the `randaug(num_layers, magnitude)` op.

big_vision's version (the TF TPU `autoaugment.py` one) needs the dead `tensorflow_addons` for
its geometric ops. This one uses only core TF, with the same op list, magnitude mapping and
per-op behaviour, so configs such as `randaug(2, 15)` mean what they meant in the paper's runs.

Each of `num_layers` layers picks one of 16 ops uniformly and always applies it at level
m = magnitude / 10 (magnitude 10 is the "max" level; big_vision configs also use 15):

  op                 argument at level m                  (+/-: sign drawn per layer, p=1/2)
  auto_contrast      -                                    per-channel stretch to 0..255
  equalize           -                                    per-channel histogram equalization
  invert             -                                    255 - x
  rotate             +/- 30*m degrees                     about the centre, fill 128
  posterize          bits = int(4*m)                      keep the top `bits` bits
  solarize           threshold = int(256*m) mod 256       x >= threshold -> 255 - x
  color              factor = 1.8*m + 0.1                 blend with grayscale
  contrast           factor = 1.8*m + 0.1                 blend with a constant gray (below)
  brightness         factor = 1.8*m + 0.1                 blend with black
  sharpness          factor = 1.8*m + 0.1                 blend with a 3x3 smoothed image
  shear_x, shear_y   +/- 0.3*m                            fill 128
  translate_x, _y    +/- 100*m pixels (absolute)          fill 128
  cutout             square of side 2*int(40*m) pixels    random centre, fill 128
  solarize_add       x < 128 -> min(x + int(110*m), 255)

Blends compute `degenerate + factor * (image - degenerate)`, clip to 0..255 and truncate to
uint8. Geometric ops sample the nearest input pixel; pixels from outside the image are 128.

Quirks of big_vision's implementation, kept on purpose (they are what the paper trained with):
- `contrast` blends towards the constant gray level min(H*W/256, 255) (the pixel COUNT over
  256, not PIL's mean gray level): 196 for 224x224 images.
- solarize's threshold int(256*m) is compared with uint8 pixels as a uint8, so it wraps
  mod 256 (TF converts the Python int 256 to uint8 0; checked with TF 2.21, and numpy 1.x,
  which TF used in 2023, wraps likewise): magnitudes 0 and 10 invert every pixel, magnitude
  15 solarizes at 128.
- magnitude 0 is not "no augmentation": posterize keeps 1 bit (TF clamps a shift by 8 to 7),
  solarize inverts every pixel, and the blend ops use factor 0.1.
- translation and cutout sizes are in pixels, independent of the image size.

Differences from big_vision (none changes what an op does beyond a rounding step):
- randomness is stateless: every draw derives from the example's `_rng` seed, so an example's
  augmentation is reproducible (big_vision uses stateful TF random ops);
- rotate / shear / translate use `ImageProjectiveTransformV3` with fill value 128 instead of
  appending a ones channel and replacing pixels where it became 0 (same result with nearest
  sampling);
- auto_contrast computes (x - lo) * 255 / (hi - lo), which maps the maximum to exactly 255
  as PIL does; big_vision's x * (255 / (hi - lo)) - lo * (255 / (hi - lo)) can give 254;
- magnitude must be in [0, 20] (above 20 posterize would need more than 8 bits).

Input and output: uint8 [H, W, 3].
"""
import math

import tensorflow as tf

from big_vision_relu.data.pp.common import get_key, take_seed
from big_vision_relu.data.pp.registry import Example, PPFn, register

FILL_VALUE = 128  # Gray used for pixels from outside the image and for cutout.
MAX_MAGNITUDE = 20


def _blend(degenerate: tf.Tensor, image: tf.Tensor, factor: float) -> tf.Tensor:
  """degenerate + factor * (image - degenerate), clipped to 0..255, truncated to uint8."""
  degenerate = tf.cast(degenerate, tf.float32)
  out = degenerate + factor * (tf.cast(image, tf.float32) - degenerate)
  return tf.cast(tf.clip_by_value(out, 0.0, 255.0), tf.uint8)


def _auto_contrast(image: tf.Tensor) -> tf.Tensor:
  x = tf.cast(image, tf.float32)
  lo = tf.reduce_min(x, axis=[0, 1], keepdims=True)
  hi = tf.reduce_max(x, axis=[0, 1], keepdims=True)
  stretched = (x - lo) * 255.0 / tf.maximum(hi - lo, 1.0)  # hi maps to exactly 255.
  # Constant channels have nothing to stretch and stay as they are.
  out = tf.where(hi > lo, stretched, x)
  return tf.cast(tf.clip_by_value(out, 0.0, 255.0), tf.uint8)


def _equalize_channel(channel: tf.Tensor) -> tf.Tensor:
  """PIL's equalize on one uint8 [H, W] channel."""
  x = tf.cast(channel, tf.int32)
  hist = tf.math.bincount(x, minlength=256, maxlength=256, dtype=tf.int32)
  last_nonzero = tf.gather(hist, tf.reduce_max(tf.where(hist > 0)))
  step = (tf.reduce_sum(hist) - last_nonzero) // 255
  safe_step = tf.maximum(step, 1)
  lut = (tf.cumsum(hist) + safe_step // 2) // safe_step
  lut = tf.clip_by_value(tf.concat([[0], lut[:-1]], axis=0), 0, 255)
  # step == 0: (almost) a single gray level, which PIL leaves unchanged.
  return tf.cast(tf.where(step > 0, tf.gather(lut, x), x), tf.uint8)


def _equalize(image: tf.Tensor) -> tf.Tensor:
  return tf.stack([_equalize_channel(image[..., c]) for c in range(3)], axis=-1)


def _posterize(image: tf.Tensor, bits: int) -> tf.Tensor:
  # TF clamps shift amounts to 0..7 for uint8, so bits=0 keeps the top bit (as big_vision).
  shift = tf.constant(8 - bits, tf.uint8)
  return tf.bitwise.left_shift(tf.bitwise.right_shift(image, shift), shift)


def _solarize(image: tf.Tensor, threshold: int) -> tf.Tensor:
  # big_vision compares the uint8 image with a Python int, which TF converts to uint8, i.e.
  # takes mod 256: threshold 256 (magnitude 10) becomes 0 and inverts every pixel.
  return tf.where(image < tf.constant(threshold % 256, tf.uint8), image, 255 - image)


def _solarize_add(image: tf.Tensor, addition: int, threshold: int = 128) -> tf.Tensor:
  added = tf.cast(tf.clip_by_value(tf.cast(image, tf.int32) + addition, 0, 255), tf.uint8)
  return tf.where(tf.cast(image, tf.int32) < threshold, added, image)


def _color(image: tf.Tensor, factor: float) -> tf.Tensor:
  gray = tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))
  return _blend(gray, image, factor)


def _contrast(image: tf.Tensor, factor: float) -> tf.Tensor:
  # big_vision's level: number of pixels / 256 (see the module docstring), truncated to uint8.
  num_pixels = tf.cast(tf.reduce_prod(tf.shape(image)[:2]), tf.float32)
  gray = tf.floor(tf.minimum(num_pixels / 256.0, 255.0))
  return _blend(tf.fill(tf.shape(image), gray), image, factor)


def _brightness(image: tf.Tensor, factor: float) -> tf.Tensor:
  return _blend(tf.zeros_like(image), image, factor)


def _sharpness(image: tf.Tensor, factor: float) -> tf.Tensor:
  """Blend with PIL's SMOOTH filter ([[1,1,1],[1,5,1],[1,1,1]]/13); the border stays as is."""
  kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
  kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
  smooth = tf.nn.depthwise_conv2d(tf.cast(image, tf.float32)[None], kernel,
                                  strides=[1, 1, 1, 1], padding="SAME")[0]
  smooth = tf.cast(tf.clip_by_value(smooth, 0.0, 255.0), tf.uint8)
  h, w = tf.shape(image)[0], tf.shape(image)[1]
  rows, cols = tf.range(h), tf.range(w)
  interior = ((rows > 0) & (rows < h - 1))[:, None] & ((cols > 0) & (cols < w - 1))[None, :]
  degenerate = tf.where(interior[:, :, None], smooth, image)
  return _blend(degenerate, image, factor)


def _transform(image: tf.Tensor, transform: list[tf.Tensor | float]) -> tf.Tensor:
  """Projective transform [a0..a7] mapping output (x, y) to input; nearest; outside -> 128."""
  transforms = tf.reshape(tf.cast(tf.stack(transform), tf.float32), [1, 8])
  return tf.raw_ops.ImageProjectiveTransformV3(
      images=image[None], transforms=transforms, output_shape=tf.shape(image)[:2],
      fill_value=float(FILL_VALUE), interpolation="NEAREST", fill_mode="CONSTANT")[0]


def _rotate(image: tf.Tensor, degrees: tf.Tensor) -> tf.Tensor:
  """Rotation about the image centre: input = R (output - centre) + centre."""
  angle = degrees * (math.pi / 180.0)
  cos, sin = tf.cos(angle), tf.sin(angle)
  h = tf.cast(tf.shape(image)[0], tf.float32) - 1
  w = tf.cast(tf.shape(image)[1], tf.float32) - 1
  x_offset = (w - (cos * w - sin * h)) / 2
  y_offset = (h - (sin * w + cos * h)) / 2
  return _transform(image, [cos, -sin, x_offset, sin, cos, y_offset, 0.0, 0.0])


def _cutout(image: tf.Tensor, half_size: int, center: tf.Tensor) -> tf.Tensor:
  """Fills rows [cy - half_size, cy + half_size) x cols [cx - ..., cx + ...) with 128."""
  rows, cols = tf.range(tf.shape(image)[0]), tf.range(tf.shape(image)[1])
  in_rows = (rows >= center[0] - half_size) & (rows < center[0] + half_size)
  in_cols = (cols >= center[1] - half_size) & (cols < center[1] + half_size)
  box = in_rows[:, None, None] & in_cols[None, :, None]
  return tf.where(box, tf.constant(FILL_VALUE, tf.uint8), image)


def _layer(image: tf.Tensor, level: float, seed: tf.Tensor) -> tf.Tensor:
  """One RandAugment layer: a uniformly chosen op at `level` (= magnitude / 10)."""
  op_seed, sign_seed, center_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, num=3))
  sign = tf.where(tf.random.stateless_uniform([], sign_seed) < 0.5, -1.0, 1.0)
  hw = tf.cast(tf.shape(image)[:2], tf.float32)
  center = tf.cast(tf.floor(tf.random.stateless_uniform([2], center_seed) * hw), tf.int32)
  enhance = 1.8 * level + 0.1
  shear = sign * 0.3 * level
  shift = sign * 100.0 * level
  branches = [
      lambda: _auto_contrast(image),
      lambda: _equalize(image),
      lambda: 255 - image,
      lambda: _rotate(image, sign * 30.0 * level),
      lambda: _posterize(image, int(4 * level)),
      lambda: _solarize(image, int(256 * level)),
      lambda: _color(image, enhance),
      lambda: _contrast(image, enhance),
      lambda: _brightness(image, enhance),
      lambda: _sharpness(image, enhance),
      lambda: _transform(image, [1.0, shear, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]),
      lambda: _transform(image, [1.0, 0.0, 0.0, shear, 1.0, 0.0, 0.0, 0.0]),
      lambda: _transform(image, [1.0, 0.0, shift, 0.0, 1.0, 0.0, 0.0, 0.0]),
      lambda: _transform(image, [1.0, 0.0, 0.0, 0.0, 1.0, shift, 0.0, 0.0]),
      lambda: _cutout(image, int(40 * level), center),
      lambda: _solarize_add(image, int(110 * level)),
  ]
  op_index = tf.random.stateless_uniform([], op_seed, minval=0, maxval=len(branches),
                                         dtype=tf.int32)
  return tf.switch_case(op_index, branches)


@register("randaug")
def get_randaug(num_layers: int = 2, magnitude: float = 10, *, key: str = "image") -> PPFn:
  """RandAugment on a uint8 [H, W, 3] image: `num_layers` random ops at `magnitude` (0..20)."""
  if not (isinstance(num_layers, int) and num_layers >= 0):
    raise ValueError(f"randaug: num_layers must be an int >= 0, got {num_layers!r}")
  if not 0 <= magnitude <= MAX_MAGNITUDE:
    raise ValueError(f"randaug: magnitude must be in [0, {MAX_MAGNITUDE}], got {magnitude}")
  level = magnitude / 10

  def apply(example: Example) -> Example:
    image = get_key(example, key, "randaug")
    if image.dtype != tf.uint8 or image.shape.rank != 3 or image.shape[-1] not in (3, None):
      raise ValueError(f"randaug needs uint8 [H, W, 3] images, got {image.dtype.name} "
                       f"{image.shape}: put it before value_range and use decode(channels=3)")
    image = tf.ensure_shape(image, [None, None, 3])
    example, seed = take_seed(example, "randaug")
    layer_seeds = tf.random.experimental.stateless_split(seed, num_layers)
    # A loop rather than unrolled layers: the 16 branches are traced once, not per layer.
    _, image = tf.while_loop(
        lambda i, _: i < num_layers,
        lambda i, x: (i + 1, _layer(x, level, layer_seeds[i])),
        (tf.constant(0), image))
    return {**example, key: image}
  return apply
