"""jax_pp's inception_crop against the tf.data op (pp/ops_image.py): its crop + resize equals
tf.image.resize of the cropped box (float64 reference, uint8 clip + truncate), its boxes have
the constraints and the distribution of TF's sample_distorted_bounding_box, they are a pure
function of the key, and an unreachable area gives the whole image. (test_memory_pipeline.py
runs it in a training batch.)"""
import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from big_vision_relu.data import jax_pp
from big_vision_relu.data.pp import ops_image

BOXES = [(3, 5, 17, 20), (0, 0, 28, 30), (10, 12, 18, 18), (1, 2, 5, 9), (0, 1, 27, 29),
         (27, 0, 1, 30)]  # (top, left, height, width) of a 28 x 30 image: up- and downscaled
SIZES = [(28, 28), (12, 40), (7, 5)]


def _bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
  """float64 [n_out, n_in]: TF's bilinear resize of one axis (half-pixel centres, the edge
  pixels repeated past the edges), written as its kernel: clamp, then interpolate."""
  centres = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
  lower = np.floor(centres).astype(int)
  upper = np.minimum(lower + 1, n_in - 1)
  weights = np.zeros((n_out, n_in))
  np.add.at(weights, (np.arange(n_out), lower), 1 - (centres - lower))
  np.add.at(weights, (np.arange(n_out), upper), centres - lower)
  return weights


@jax.jit
def _crop_resize_all(images: jax.Array, boxes: jax.Array) -> dict:
  """{(size, antialias): float32 [images, boxes, *size, c]}, one compiled program for all."""
  out = {}
  for size in SIZES:
    for antialias in (False, True):
      one = functools.partial(jax_pp.crop_and_resize, size=size, antialias=antialias)
      out[size, antialias] = jax.vmap(jax.vmap(one, (None, 0)), (0, None))(images, boxes)
  return out


def test_crop_and_resize_is_tf_resize_of_the_box():
  rng = np.random.default_rng(0)
  image = rng.random((28, 30, 3), np.float32)
  image_u8 = rng.integers(0, 256, (28, 30, 3), np.uint8)
  # crop_and_resize resizes in float32 whatever the input dtype.
  resized = _crop_resize_all(np.stack([image, image_u8.astype(np.float32)]),
                             jnp.array(BOXES, jnp.int32))
  equal = total = 0
  for (size, antialias), (got, got_u8) in resized.items():
    got_u8 = np.asarray(jax_pp._as_dtype(got_u8, np.uint8))
    for i, (top, left, height, width) in enumerate(BOXES):
      window, case = np.s_[top:top + height, left:left + width], (BOXES[i], size, antialias)
      want = tf.image.resize(image[window].astype(np.float64), size, "bilinear",
                             antialias=antialias).numpy()
      np.testing.assert_allclose(got[i], want, rtol=0, atol=1e-5, err_msg=str(case))
      if not antialias:
        want = np.einsum("yh,hwc,xw->yxc", _bilinear_weights(height, size[0]),
                         image[window].astype(np.float64), _bilinear_weights(width, size[1]))
        np.testing.assert_allclose(got[i], want, rtol=0, atol=1e-5, err_msg=str(case))
      # uint8: the TF op's clip + truncate. Both resize in float32, so where the exact value
      # is an integer, float32 error can put either just below it: one level apart there only.
      want = ops_image._resize(tf.constant(image_u8[window]), tf.constant(size), "bilinear",
                               antialias).numpy()
      resized_tf = tf.image.resize(image_u8[window], size, "bilinear",
                                   antialias=antialias).numpy()
      differ = got_u8[i] != want
      assert np.abs(got_u8[i].astype(int) - want).max() <= 1, case
      np.testing.assert_allclose(resized_tf[differ], np.round(resized_tf[differ]), atol=2e-3)
      equal, total = equal + np.sum(~differ), total + want.size
  assert equal / total > 0.97, equal / total  # 98.5% when written


def _tf_boxes(height: int, width: int, area_min: float, area_max: float, n: int) -> np.ndarray:
  """int32 [n, 4]: (top, left, height, width) of the TF op's boxes for seeds (i, 1)."""
  @tf.function
  def boxes(seeds: tf.Tensor) -> tf.Tensor:
    def one(seed: tf.Tensor) -> tf.Tensor:
      begin, size = ops_image._crop_box(tf.constant([height, width, 1]), seed, area_min,
                                        area_max)
      return tf.concat([begin[:2], size[:2]], 0)
    return tf.map_fn(one, seeds, fn_output_signature=tf.int32)
  return boxes(tf.stack([tf.range(n, dtype=tf.int64), tf.ones(n, tf.int64)], 1)).numpy()


# (image height, width, area_min, area_max): the study's crop, the op's default area range, an
# area no box of ratio [0.75, 1.33] reaches (half of 10 x 40 needs w >= 20 with h <= 10).
CASES = [(28, 28, 50, 100), (24, 40, 5, 100), (10, 40, 50, 100)]


@jax.jit
def _jax_boxes(keys: jax.Array) -> dict:
  """{case: int32 [keys, 4]} (top, left, height, width), one compiled program for all."""
  return {case: jax.vmap(lambda k, case=case: jax_pp._sample_box(k, *case))(keys)
          for case in CASES}


@pytest.fixture(scope="module")
def keys() -> jax.Array:
  return jax.random.split(jax.random.key(0), 10_000)


def _total_variation(a: np.ndarray, b: np.ndarray) -> float:
  values = np.union1d(a, b)
  return 0.5 * sum(abs(np.mean(a == v) - np.mean(b == v)) for v in values)


@pytest.mark.parametrize("case", CASES[:2])
def test_boxes_follow_tf_sample_distorted_bounding_box(keys, case):
  height, width, area_min, area_max = case
  boxes = np.asarray(_jax_boxes(keys)[case])
  want = _tf_boxes(*case, 10_000)
  for got in (boxes, want):  # the same constraints on both
    top, left, h, w = got.T
    area = 100 * h * w / (height * width)
    assert area.min() >= area_min and area.max() <= area_max
    # w = round(h * r), r in [0.75, 1.33): the ratio within half a pixel of the range.
    assert np.all(w >= 0.75 * h - 0.5) and np.all(w <= 1.33 * h + 0.5)
    assert top.min() >= 0 and left.min() >= 0
    # TF's offsets are in [0, H - h): the box touches the bottom / right edge only if spanning.
    assert np.all((top + h < height) | (h == height))
    assert np.all((left + w < width) | (w == width))
  # The same distribution: sampling noise alone gives total variations up to 0.04 for each
  # coordinate and 0.08 for (height, width) (seeds 0-2 when written), mean areas within 0.15%.
  for i, name in enumerate(("top", "left", "height", "width")):
    assert _total_variation(boxes[:, i], want[:, i]) < 0.06, name
  shapes = [b[:, 2] * 1000 + b[:, 3] for b in (boxes, want)]
  assert _total_variation(*shapes) < 0.12
  assert abs(np.mean(boxes[:, 2] * boxes[:, 3]) - np.mean(want[:, 2] * want[:, 3])) < (
      0.005 * height * width)
  ours, tfs = (collections.Counter(s) for s in shapes)  # what one draws often, the other draws
  assert {s for s, c in ours.items() if c >= 20} <= set(tfs)
  assert {s for s, c in tfs.items() if c >= 20} <= set(ours)


def test_same_key_same_crop_and_an_unreachable_area_is_the_whole_image(keys):
  boxes = _jax_boxes(keys)
  for case, again in _jax_boxes(keys).items():
    np.testing.assert_array_equal(again, boxes[case])
  assert len(set(map(tuple, np.asarray(boxes[CASES[0]])))) > 1000  # other keys, other boxes
  np.testing.assert_array_equal(boxes[CASES[2]], [[0, 0, 10, 40]] * len(keys))
  np.testing.assert_array_equal(_tf_boxes(*CASES[2], 20), [[0, 0, 10, 40]] * 20)
  image = np.random.default_rng(1).random((4, 10, 40, 3), np.float32)
  crop = jax.jit(jax_pp.batch_preprocess_fn("inception_crop((12, 16), area_min=50)",
                                            random=True))
  out = crop({"image": image}, keys[:4])["image"]
  np.testing.assert_allclose(out, tf.image.resize(image, (12, 16)).numpy(), rtol=0, atol=1e-5)


def test_bad_arguments_say_what_to_change():
  with pytest.raises(ValueError, match="needs a size, e.g. inception_crop\\(28\\)"):
    jax_pp.batch_preprocess_fn("inception_crop(area_min=50)", random=True)
  with pytest.raises(ValueError, match="0 < area_min <= area_max <= 100"):
    jax_pp.batch_preprocess_fn("inception_crop(28, area_min=60, area_max=50)", random=True)
  with pytest.raises(ValueError, match="method='bilinear' only, got 'nearest'"):
    jax_pp.batch_preprocess_fn("inception_crop(28, method='nearest')", random=True)
  with pytest.raises(ValueError, match="evaluation pp strings must be deterministic"):
    jax_pp.batch_preprocess_fn("inception_crop(28)", random=False)
