"""The pp mini-language: parser, registry and every op on small concrete inputs."""
import numpy as np
import pytest
import tensorflow as tf

from big_vision_relu.data import pp


def run(pp_str: str, rng=(1, 2), **features) -> dict:
  """Applies a pp string to one example (numpy values); returns numpy outputs."""
  example = {k: tf.constant(v) for k, v in features.items()}
  if rng is not None:
    example[pp.RNG_KEY] = tf.constant(rng, tf.int64)
  return {k: v.numpy() for k, v in pp.get_preprocess_fn(pp_str)(example).items()}


def image(h=6, w=8, c=3, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def test_parse_names_args_kwargs_and_literals():
  assert pp.parse('decode|resize(224)|value_range(-1, 1)|keep("image", "labels")') == [
      ("decode", (), {}), ("resize", (224,), {}), ("value_range", (-1, 1), {}),
      ("keep", ("image", "labels"), {})]
  assert pp.parse('onehot(10, key="a|b", on=0.9)|central_crop((2, 3))') == [
      ("onehot", (10,), {"key": "a|b", "on": 0.9}), ("central_crop", ((2, 3),), {})]


@pytest.mark.parametrize("bad", ["", "decode|", "resize(224", "resize(size)",
                                 'resize(__import__("os"))', "a.b(1)", "resize(*[1])",
                                 "decode + resize(2)", "resize(**{'size': 2})"])
def test_parse_rejects_malformed_strings(bad):
  with pytest.raises(ValueError):
    pp.parse(bad)


def test_unknown_op_lists_the_registered_ops():
  with pytest.raises(ValueError, match="Unknown pp op 'nope'.*decode.*randaug"):
    pp.get_preprocess_fn("decode|nope(3)")
  assert {"decode", "decode_jpeg_and_inception_crop", "inception_crop", "resize",
          "resize_small", "central_crop", "random_crop", "flip_lr", "value_range", "onehot",
          "keep", "drop", "randaug"} <= set(pp.registered_ops())


def test_wrong_arguments_fail_when_parsed():
  with pytest.raises(ValueError, match="resize rejected its arguments"):
    pp.get_preprocess_fn("resize(2, 'bilinear', False, 4)")
  with pytest.raises(ValueError, match="channels"):
    pp.get_preprocess_fn("decode(2)")
  with pytest.raises(ValueError, match="size"):
    pp.get_preprocess_fn("central_crop(-3)")


def test_register_refuses_duplicates():
  with pytest.raises(ValueError, match="already registered"):
    pp.register("decode")(lambda: None)


def test_decode_precise_jpeg():
  yy, xx = np.mgrid[0:16, 0:16]
  x = np.stack([yy * 8, xx * 8, (yy + xx) * 4], -1).astype(np.uint8)  # Smooth: JPEG-friendly.
  jpeg = tf.io.encode_jpeg(x, quality=100).numpy()
  out = run("decode(precise=True)", image=jpeg)["image"]
  assert out.shape == x.shape and np.abs(out.astype(int) - x).mean() < 2


def test_decode_grayscale_png_to_one_or_three_channels():
  gray = image(5, 7, 1)
  png = tf.io.encode_png(gray).numpy()
  np.testing.assert_array_equal(run("decode(1)", image=png)["image"], gray)
  np.testing.assert_array_equal(run("decode(0)", image=png)["image"], gray)
  np.testing.assert_array_equal(run("decode", image=png)["image"], np.repeat(gray, 3, -1))


def test_value_range():
  x = np.array([[[0, 51, 255]]], np.uint8)
  out = run("value_range(-1, 1)", image=x)["image"]
  assert out.dtype == np.float32
  np.testing.assert_allclose(out, [[[-1, -0.6, 1]]], atol=1e-6)
  np.testing.assert_allclose(run("value_range(0, 1, 0, 100)", image=x)["image"],
                             [[[0, 0.51, 2.55]]], rtol=1e-6)
  np.testing.assert_allclose(run("value_range(0, 1, 0, 100, True)", image=x)["image"],
                             [[[0, 0.51, 1]]], rtol=1e-6)
  per_channel = run("value_range(0, 1, [0, 51, 0], [255, 102, 510])", image=x)["image"]
  np.testing.assert_allclose(per_channel, [[[0, 0, 0.5]]], atol=1e-6)


def test_onehot_single_multi_and_custom_keys():
  out = run("onehot(4)", label=np.int64(2))
  np.testing.assert_array_equal(out["labels"], [0, 0, 1, 0])
  assert out["labels"].dtype == np.float32 and out["label"] == 2
  np.testing.assert_array_equal(run("onehot(5)", label=np.array([0, 3]))["labels"],
                                [1, 0, 0, 1, 0])
  np.testing.assert_array_equal(run("onehot(3, multi=False)", label=np.array([0, 2]))["labels"],
                                [[1, 0, 0], [0, 0, 1]])
  out = run('onehot(3, key="y", key_result="y", on=0.9, off=0.05)', y=np.int64(0))
  np.testing.assert_allclose(out["y"], [0.9, 0.05, 0.05])


def test_central_crop_matches_numpy_slicing():
  x = image(7, 10)
  np.testing.assert_array_equal(run("central_crop(4)", image=x)["image"], x[1:5, 3:7])
  np.testing.assert_array_equal(run("central_crop((3, 5))", image=x)["image"], x[2:5, 2:7])
  np.testing.assert_array_equal(run("central_crop", image=x)["image"], x[:, 1:8])
  with pytest.raises(tf.errors.InvalidArgumentError):
    run("central_crop(8)", image=x)


@pytest.mark.parametrize("shape, small, expected", [
    ((20, 40), 10, (10, 20)), ((30, 20), 10, (15, 10)), ((7, 10), 4, (4, 6)),
    ((5, 5), 8, (8, 8))])
def test_resize_small_keeps_aspect_ratio(shape, small, expected):
  out = run(f"resize_small({small})", image=image(*shape))["image"]
  assert out.shape == (*expected, 3) and out.dtype == np.uint8


def test_resize_keeps_dtype_and_constant_images():
  x = np.full((6, 9, 3), 77, np.uint8)
  out = run("resize(4)", image=x)["image"]
  assert out.shape == (4, 4, 3) and out.dtype == np.uint8 and (out == 77).all()
  # uint8 results are truncated like big_vision's: 0 and 255 interpolate to 127.5 -> 127.
  edge = np.zeros((1, 2, 1), np.uint8)
  edge[0, 1] = 255
  assert run("resize((1, 3))", image=edge)["image"][0, 1, 0] == 127
  out = run("resize((3, 5))", image=x.astype(np.float32))["image"]
  assert out.shape == (3, 5, 3) and out.dtype == np.float32


def test_flip_lr_is_deterministic_per_seed_and_flips_about_half():
  x = image()
  flipped = []
  for s in range(40):
    out = run("flip_lr", rng=(s, 7), image=x)["image"]
    np.testing.assert_array_equal(out, run("flip_lr", rng=(s, 7), image=x)["image"])
    assert np.array_equal(out, x) or np.array_equal(out, x[:, ::-1])
    flipped.append(not np.array_equal(out, x))
  assert 8 < sum(flipped) < 32


def _is_window(window: np.ndarray, x: np.ndarray) -> bool:
  h, w = window.shape[:2]
  return any(np.array_equal(x[i:i + h, j:j + w], window)
             for i in range(x.shape[0] - h + 1) for j in range(x.shape[1] - w + 1))


def test_random_crop_is_a_deterministic_window():
  x = image(9, 11)
  outs = [run("random_crop((4, 5))", rng=(s, 0), image=x)["image"] for s in range(6)]
  assert all(o.shape == (4, 5, 3) and _is_window(o, x) for o in outs)
  assert len({o.tobytes() for o in outs}) > 1
  np.testing.assert_array_equal(outs[0], run("random_crop((4, 5))", rng=(0, 0), image=x)["image"])


def test_inception_crop_window_and_resize():
  x = image(20, 30)
  crop = run("inception_crop", image=x)["image"]
  assert _is_window(crop, x) and crop.size >= 0.05 * x.size
  out = run("inception_crop(8, 50, 60)", image=x)["image"]
  assert out.shape == (8, 8, 3) and out.dtype == np.uint8
  np.testing.assert_array_equal(out, run("inception_crop(8, 50, 60)", image=x)["image"])
  with pytest.raises(ValueError, match="area_min"):
    pp.get_preprocess_fn("inception_crop(8, 0)")


def test_decode_jpeg_and_inception_crop_equals_decode_then_crop():
  # Same box for the same seed; pixels agree up to JPEG chroma upsampling at the box edge.
  yy, xx = np.mgrid[0:64, 0:48]
  x = np.stack([yy * 4, xx * 5, (yy + xx) * 2], -1).astype(np.uint8)
  jpeg = tf.io.encode_jpeg(x, quality=95).numpy()
  for s in range(3):
    fused = run("decode_jpeg_and_inception_crop", rng=(s, 1), image=jpeg)["image"]
    split = run("decode|inception_crop", rng=(s, 1), image=jpeg)["image"]
    assert fused.shape == split.shape
    assert np.abs(fused.astype(int) - split)[1:-1, 1:-1].max() <= 2
  out = run("decode_jpeg_and_inception_crop(16)", image=jpeg)["image"]
  assert out.shape == (16, 16, 3) and out.dtype == np.uint8


def test_keep_and_drop():
  features = dict(image=image(), label=np.int64(1), extra=np.float32(2))
  assert set(run('keep("image", "label")', **features)) == {"image", "label", pp.RNG_KEY}
  assert set(run('drop("extra")', rng=None, **features)) == {"image", "label"}
  with pytest.raises(ValueError, match="'missing'"):
    run('keep("image", "missing")', **features)
  with pytest.raises(ValueError, match="'missing'"):
    run('drop("missing")', **features)


def test_random_ops_need_a_seed_and_consume_it():
  with pytest.raises(ValueError, match="_rng"):
    run("flip_lr", rng=None, image=image())
  out = run("flip_lr|flip_lr", image=image())
  assert out[pp.RNG_KEY].shape == (2,) and not np.array_equal(out[pp.RNG_KEY], [1, 2])


def test_pp_runs_in_a_tf_data_graph_like_eagerly():
  x = image(10, 12)
  pp_str = "inception_crop(6)|flip_lr|randaug(2, 10)|value_range(-1, 1)|onehot(3)"
  example = {"image": x, "label": np.int64(1), pp.RNG_KEY: np.array([3, 4], np.int64)}
  ds = tf.data.Dataset.from_tensors(example).map(pp.get_preprocess_fn(pp_str))
  graph = next(iter(ds.as_numpy_iterator()))
  eager = run(pp_str, rng=(3, 4), image=x, label=np.int64(1))
  for k in eager:
    np.testing.assert_array_equal(graph[k], eager[k])
