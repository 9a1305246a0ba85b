"""RandAugment: the whole op (shape, dtype, determinism) and its image ops against PIL / numpy."""
import numpy as np
from PIL import Image, ImageEnhance, ImageOps
import pytest
import tensorflow as tf

from big_vision_relu.data import pp
from big_vision_relu.data.pp import randaug


def image(h=16, w=20, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def randaug_fn(num_layers, magnitude):
  fn = pp.get_preprocess_fn(f"randaug({num_layers}, {magnitude})")
  return lambda x, rng: fn({"image": tf.constant(x),
                            pp.RNG_KEY: tf.constant(rng, tf.int64)})["image"].numpy()


def test_randaug_shape_dtype_determinism_and_seed_dependence():
  x = image()
  augment = randaug_fn(2, 15)
  outs = [augment(x, (s, 0)) for s in range(12)]
  assert all(o.shape == x.shape and o.dtype == np.uint8 for o in outs)
  np.testing.assert_array_equal(outs[3], augment(x, (3, 0)))
  assert len({o.tobytes() for o in outs}) > 6
  np.testing.assert_array_equal(randaug_fn(0, 10)(x, (0, 0)), x)


def test_randaug_rejects_bad_arguments_and_inputs():
  with pytest.raises(ValueError, match="magnitude"):
    pp.get_preprocess_fn("randaug(2, 25)")
  with pytest.raises(ValueError, match="num_layers"):
    pp.get_preprocess_fn("randaug(-1, 5)")
  with pytest.raises(ValueError, match="uint8"):
    randaug_fn(1, 5)(image().astype(np.float32), (0, 0))
  with pytest.raises(ValueError, match="uint8"):
    randaug_fn(1, 5)(image()[..., :1], (0, 0))


def pil(x: np.ndarray) -> Image.Image:
  return Image.fromarray(x)


def test_pointwise_ops_match_pil():
  x = image(24, 24, seed=1)
  t = tf.constant(x)
  np.testing.assert_array_equal(randaug._equalize(t).numpy(), np.asarray(ImageOps.equalize(pil(x))))
  low_contrast = (x // 4 + 60).astype(np.uint8)
  np.testing.assert_array_equal(randaug._auto_contrast(tf.constant(low_contrast)).numpy(),
                                np.asarray(ImageOps.autocontrast(pil(low_contrast))))
  np.testing.assert_array_equal(randaug._posterize(t, 3).numpy(),
                                np.asarray(ImageOps.posterize(pil(x), 3)))
  np.testing.assert_array_equal(randaug._solarize(t, 100).numpy(),
                                np.asarray(ImageOps.solarize(pil(x), 100)))


def test_blend_ops_match_pil_up_to_rounding():
  x = image(24, 24, seed=2)
  t = tf.constant(x)
  for factor in (0.1, 0.7, 1.9):
    for ours, theirs in ((randaug._brightness, ImageEnhance.Brightness),
                         (randaug._color, ImageEnhance.Color),
                         (randaug._sharpness, ImageEnhance.Sharpness)):
      expected = np.asarray(theirs(pil(x)).enhance(factor)).astype(int)
      assert np.abs(ours(t, factor).numpy() - expected).max() <= 1, (ours, factor)


def test_big_vision_quirks_are_kept():
  x = image(32, 32)
  # contrast degenerates to the gray level pixel_count / 256 = 4, not to the mean.
  np.testing.assert_array_equal(randaug._contrast(tf.constant(x), 0.0).numpy(), 4)
  # posterize to 0 bits keeps the top bit (TF clamps the shift by 8 to 7).
  np.testing.assert_array_equal(randaug._posterize(tf.constant(x), 0).numpy(), x & 128)
  # solarize thresholds wrap mod 256 (uint8): 0 and 256 invert everything, 384 acts as 128.
  for threshold in (0, 256):
    np.testing.assert_array_equal(randaug._solarize(tf.constant(x), threshold).numpy(), 255 - x)
  np.testing.assert_array_equal(randaug._solarize(tf.constant(x), 384).numpy(),
                                np.where(x < 128, x, 255 - x))


def test_geometric_ops():
  x = image(9, 9)
  np.testing.assert_array_equal(randaug._rotate(tf.constant(x), 90.0).numpy(), np.rot90(x))
  shifted = randaug._transform(tf.constant(x), [1, 0, 2, 0, 1, 0, 0, 0]).numpy()
  np.testing.assert_array_equal(shifted[:, :-2], x[:, 2:])
  assert (shifted[:, -2:] == randaug.FILL_VALUE).all()
  sheared = randaug._transform(tf.constant(x), [1, 0.5, 0, 0, 1, 0, 0, 0]).numpy()
  np.testing.assert_array_equal(sheared[0], x[0])  # Row 0 does not move under shear_x.


def test_cutout_fills_the_box_around_the_centre():
  x = image(10, 12)
  out = randaug._cutout(tf.constant(x), 2, tf.constant([1, 5])).numpy()
  box = np.zeros((10, 12), bool)
  box[0:3, 3:7] = True
  assert (out[box] == randaug.FILL_VALUE).all()
  np.testing.assert_array_equal(out[~box], x[~box])


def test_solarize_add():
  x = np.array([[[0, 127, 128], [200, 100, 20]]], np.uint8)
  np.testing.assert_array_equal(randaug._solarize_add(tf.constant(x), 110).numpy(),
                                [[[110, 237, 128], [200, 210, 130]]])
