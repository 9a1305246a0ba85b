"""The in-memory input pipeline against the tf.data one: the same records (TFDS's order, split
slices, holdout parts), JAX pp ops equal to the tf.data ops, augmentation and data order pure
functions of (seed, position) with each process's rows of every global batch, padded eval
shares. (tests/test_tf_free.py trains through it where TensorFlow is not installed;
test_fashion_mnist.py compares Fashion-MNIST with its TFDS build.)"""
import jax
import numpy as np
import pytest
import tensorflow as tf

from big_vision_relu.data import arrays, batching, datasets, input_pipeline, inputs, jax_pp
from big_vision_relu.data import memory_pipeline
from big_vision_relu.data import pp as tf_pp
from conftest import PRODUCTION_COMPILE, load_config_module

SPLITS = ("train", "test", "train[:100]", "test[10%:]", "train[-50:]", "test[25%:75%]")


def _tfds_records(data_dir, name, split):
  source = datasets.get_builder(name, data_dir).as_data_source(split)
  examples = source.__getitems__(list(range(len(source))))
  return np.stack([e["image"] for e in examples]), np.array([e["label"] for e in examples])


@pytest.mark.parametrize("name", ["mnist5k", "digits"])
def test_record_r_is_record_r_of_the_tfds_build(offline_data_dir, name):
  for split in SPLITS:
    images, labels = _tfds_records(offline_data_dir, name, split)
    got = arrays.load(dict(name=name, split=split))
    np.testing.assert_array_equal(got.images, images, err_msg=split)
    np.testing.assert_array_equal(got.labels, labels, err_msg=split)
  # The holdout part selects the same records from the same labels (data/holdout.py).
  spec = dict(num_examples=100, seed=3, part="held_out")
  numbers = input_pipeline._holdout_numbers(name, "train", offline_data_dir, 100, 3, "held_out")
  images, labels = _tfds_records(offline_data_dir, name, "train")
  got = arrays.load(dict(name=name, split="train", holdout=spec))
  np.testing.assert_array_equal(got.images, images[numbers])
  rest = arrays.load(dict(name=name, split="train", holdout=dict(spec, part="rest")))
  assert len(rest) + len(got) == len(labels)


def test_bad_splits_and_names_say_what_to_change():
  with pytest.raises(ValueError, match="not one of the in-memory datasets.*input.pipeline='tfds'"):
    arrays.load(dict(name="cifar100", split="train"))
  with pytest.raises(ValueError, match="digits has splits train, test, not 'validation'"):
    arrays.load(dict(name="digits", split="validation"))
  with pytest.raises(ValueError, match="take no '\\+'"):
    arrays.load(dict(name="digits", split="train+test"))
  with pytest.raises(ValueError, match="reaches past the 359 examples"):
    arrays.load(dict(name="digits", split="test[:400]"))


def _tf_apply(pp, example):
  out = tf_pp.get_preprocess_fn(pp)({k: tf.constant(v) for k, v in example.items()})
  return {k: v.numpy() for k, v in out.items()}


def test_deterministic_ops_equal_the_tf_ops():
  images, labels = arrays.load(dict(name="digits", split="test[:16]")).images, np.arange(16) % 10
  rng = np.random.default_rng(0)
  rgb = rng.integers(0, 256, (16, 9, 11, 3), np.uint8)
  cases = [  # (pp string, images)
      ('central_crop(6)|value_range(0, 1, clip_values=True)|onehot(10)|keep("image", "labels")',
       images),
      ('central_crop|value_range(-1, 1, [0, 10, 20], [255, 200, 250])|drop("label")', rgb),
      ('value_range(-1, 1)|resize(28)', images), ('value_range|resize((5, 7))', rgb),
      ('resize(28)', images), ('resize((5, 7))', images), ('resize(4, antialias=True)', rgb),
  ]
  for pp, batch in cases:
    got = jax.jit(jax_pp.batch_preprocess_fn(pp, random=False),
                  compiler_options=PRODUCTION_COMPILE)(
        {"image": batch, "label": labels.astype(np.int32)})
    for i in range(4):  # eager tf.data ops: seconds per example
      want = _tf_apply(pp, {"image": batch[i], "label": labels[i]})
      assert set(got) == set(want), pp
      for key, value in want.items():
        if got[key].dtype == np.uint8:  # resized uint8: rounding may move a truncation by 1
          assert np.abs(got[key][i].astype(int) - value).max() <= 1, pp
          assert np.mean(got[key][i] == value) > 0.95, pp
        else:
          np.testing.assert_allclose(got[key][i], value, rtol=0, atol=2e-6, err_msg=pp)
  grey = jax_pp.batch_preprocess_fn("decode(channels=3)", random=False)({"image": images})
  np.testing.assert_array_equal(grey["image"], np.repeat(images, 3, axis=-1))


def test_random_ops_are_pure_functions_of_seed_and_position():
  images = np.random.default_rng(0).integers(0, 256, (64, 12, 10, 1), np.uint8)
  pp = jax.jit(memory_pipeline.preprocess_fn("flip_lr|random_crop((8, 6))", seed=5))
  positions = np.stack([np.full(64, 2), np.arange(64)], 1).astype(np.uint32)  # 2**33 + i
  out = np.asarray(pp({"image": images, "label": np.zeros(64, np.int32),
                       "_position": positions})["image"])
  flipped, offsets = [], set()
  for image, crop in zip(images, out):
    windows = {(f, t, l) for f in (0, 1) for t in range(5) for l in range(5)
               if np.array_equal((image[:, ::-1] if f else image)[t:t + 8, l:l + 6], crop)}
    assert windows, "not a crop of the (flipped) image"
    flipped.append(min(windows)[0])
    offsets |= {w[1:] for w in windows}
  assert 16 < sum(flipped) < 48 and len(offsets) > 10  # both halves, many windows
  again = pp({"image": images[::-1], "label": np.zeros(64, np.int32),
              "_position": positions[::-1]})["image"]
  np.testing.assert_array_equal(np.asarray(again)[::-1], out)  # follows the position
  other = jax.jit(memory_pipeline.preprocess_fn("flip_lr|random_crop((8, 6))", seed=6))
  assert not np.array_equal(other({"image": images, "label": np.zeros(64, np.int32),
                                   "_position": positions})["image"], out)
  with pytest.raises(ValueError, match="evaluation pp strings must be deterministic"):
    memory_pipeline.preprocess_fn("flip_lr", seed=None)
  with pytest.raises(ValueError, match="'randaug' has no JAX version: .* supports central_crop"):
    memory_pipeline.preprocess_fn("randaug(2, 10)", seed=0)


def test_training_order_resumes_exactly_and_splits_over_processes():
  data, batch = dict(name="digits", split="train"), 64  # 1,438 examples: epochs end mid-batch
  whole = memory_pipeline.TrainingBatches(data, batch, seed=7, process_index=0, process_count=1)
  steps = [next(whole) for _ in range(46)]  # 2.05 epochs
  split = arrays.load(data)
  positions = np.concatenate([(s["_position"][:, 0].astype(np.int64) << 32)
                              + s["_position"][:, 1] for s in steps])
  np.testing.assert_array_equal(positions, np.arange(46 * batch))
  order = np.concatenate([memory_pipeline.epoch_permutation(7, e, 1438) for e in range(3)])
  for key, values in (("image", split.images), ("label", split.labels)):
    np.testing.assert_array_equal(np.concatenate([s[key] for s in steps]),
                                  values[order[:46 * batch]])
  for e in range(2):  # every epoch a permutation of the whole split, a different one
    assert sorted(order[e * 1438:(e + 1) * 1438]) == list(range(1438))
  assert not np.array_equal(order[:1438], order[1438:2876])
  resumed = memory_pipeline.TrainingBatches(data, batch, seed=7, start_step=22, process_index=0,
                                            process_count=1)
  for step in range(22, 46):
    got = next(resumed)
    for key in got:
      np.testing.assert_array_equal(got[key], steps[step][key])
  hosts = [memory_pipeline.TrainingBatches(data, batch, seed=7, start_step=21, process_index=h,
                                           process_count=4) for h in range(4)]
  for step in range(21, 24):
    parts = [next(h) for h in hosts]
    for key in steps[step]:
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), steps[step][key])


def test_eval_shares_are_padded_and_cover_the_split_once():
  data, n = dict(name="digits", split="test"), 359
  split = arrays.load(data)
  seen = []
  for host in range(3):
    batches = list(memory_pipeline.eval_batches(data, 48, process_index=host, process_count=3))
    assert len(batches) == batching.num_eval_steps(n, 48, 3) == 8
    for b in batches:
      real = b[batching.MASK_KEY]
      np.testing.assert_array_equal(b["image"][real], split.images[b[batching.RECORD_KEY][real]])
      assert not b["image"][~real].any() and (b[batching.RECORD_KEY][~real] == -1).all()
      seen += list(b[batching.RECORD_KEY][real])
  assert seen == list(range(n))


def test_the_training_pp_makes_what_the_step_reads():
  config = dict(pipeline="memory", data=dict(name="digits", split="train"), batch_size=8,
                pp='decode(channels=1)|value_range(-1, 1)|keep("image")', prefetch=2)
  with pytest.raises(ValueError, match="makes \\['image'\\]; the training step needs image, "
                                       "labels"):
    inputs.training_image_shape(config, 0, process_index=0, process_count=1)
  config["pp"] = 'resize(16)|value_range(-1, 1)|onehot(10)|keep("image", "labels")'
  assert inputs.training_image_shape(config, 0, process_index=0, process_count=1) == (16, 16, 1)


def test_the_study_crop_pp_batches_as_the_tfds_path_and_by_position(offline_data_dir):
  study = load_config_module("configs/study/fmnist_vit.py").get_config("crop=50,input=memory")
  assert "|inception_crop(28, area_min=50)|flip_lr|" in study.input.pp
  # Its pp on mnist5k (28 x 28 grey as Fashion-MNIST, and built for TFDS in the tests).
  config = dict(pipeline="memory", data=dict(name="mnist5k", split="train"), batch_size=16,
                pp=study.input.pp, prefetch=1)
  kw = dict(seed=3, process_index=0, process_count=1)
  step = jax.jit(inputs.step_preprocess_fn(config, 3))
  raw = next(inputs.training_batches(config, start_step=5, **kw))
  got = {k: np.asarray(v) for k, v in step(raw).items()}
  tfds_config = dict(config, pipeline="tfds", data=dict(config["data"], data_dir=offline_data_dir))
  tfds_batches = inputs.training_batches(tfds_config, start_step=5, **kw)
  want = next(tfds_batches)
  tfds_batches.close()
  assert {k: (v.shape, v.dtype) for k, v in got.items()} == {
      k: (v.shape, v.dtype) for k, v in want.items()} == {
      "image": ((16, 28, 28, 1), np.float32), "labels": ((16, 10), np.float32)}
  np.testing.assert_array_equal(got["labels"].argmax(1), raw["label"])
  # Cropped: not the (flipped) image itself but where the box spans it (0.7% of boxes). A pure
  # function of (seed, position): the batch of the reversed rows (their positions with them) is
  # the reversed batch. (Resumed runs read the same raw batches:
  # test_training_order_resumes_exactly_and_splits_over_processes.)
  plain = raw["image"].astype(np.float32) / 127.5 - 1
  assert sum(np.allclose(g, p, atol=1e-5) or np.allclose(g, p[:, ::-1], atol=1e-5)
             for g, p in zip(got["image"], plain)) < 4
  reversed_rows = {k: v[::-1] for k, v in raw.items()}
  np.testing.assert_array_equal(np.asarray(step(reversed_rows)["image"])[::-1], got["image"])
