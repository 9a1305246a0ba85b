"""The trivial baselines: 1-NN and ridge against numpy float64 references, and the whole
`baselines.compute` on the main job's config against an independent read of the data and an
independent forward pass of the random network."""
import jax
import numpy as np
import pytest

from big_vision_relu import run as run_lib
from big_vision_relu.experiments import baseline_scores, baselines, sweep
from big_vision_relu.evaluators import fewshot
from conftest import ROOT


def _numpy_1nn(x_train, y_train, x_test):
  """Squared Euclidean distances in float64, |a|^2 - 2 a.b + |b|^2, nearest label."""
  d = (x_test ** 2).sum(1)[:, None] - 2 * x_test @ x_train.T + (x_train ** 2).sum(1)[None, :]
  return y_train[np.argmin(d, axis=1)]


def _numpy_ridge(x_train, y_train, x_test, alpha=1.0):
  """scikit-learn's RidgeClassifier by its definition: {-1, +1} targets, centred least squares
  with an l2 penalty alpha, argmax of the decision function."""
  classes = np.unique(y_train)
  targets = np.where(y_train[:, None] == classes[None, :], 1.0, -1.0)
  x_mean, t_mean = x_train.mean(0), targets.mean(0)
  xc, tc = x_train - x_mean, targets - t_mean
  w = np.linalg.solve(xc.T @ xc + alpha * np.eye(x_train.shape[1]), xc.T @ tc)
  return classes[np.argmax((x_test - x_mean) @ w + t_mean, axis=1)]


def test_classifiers_equal_numpy_references():
  rng = np.random.default_rng(0)
  centers = rng.normal(size=(4, 20))
  y_train, y_test = rng.integers(0, 4, 200), rng.integers(0, 4, 80)
  x_train = centers[y_train] + 1.5 * rng.normal(size=(200, 20))
  x_test = centers[y_test] + 1.5 * rng.normal(size=(80, 20))
  got = baselines.classifiers(x_train, y_train, x_test, y_test)
  assert got["1nn"] == np.mean(_numpy_1nn(x_train, y_train, x_test) == y_test)
  assert got["ridge"] == np.mean(_numpy_ridge(x_train, y_train, x_test) == y_test)
  assert 0.3 < got["1nn"] < 1 and 0.3 < got["ridge"] < 1  # not trivially 0 or 1


def _pixels_and_labels(name, split, data_dir):
  """Independent of the pipelines: TFDS's decoded examples, scaled to [-1, 1] and flattened,
  in the split's record order."""
  import tensorflow_datasets as tfds
  source = tfds.builder(name, data_dir=data_dir).as_data_source(split)
  examples = source.__getitems__(list(range(len(source))))
  images = np.stack([e["image"] for e in examples]).astype(np.float64)
  return (images.reshape(len(examples), -1) / 127.5 - 1,
          np.array([e["label"] for e in examples]))


@pytest.mark.slow
def test_compute_on_the_main_jobs_config(offline_data_dir, monkeypatch):
  monkeypatch.chdir(ROOT)
  config = sweep.load_config_file("configs/local/mnist_relu.py:runlocal")
  config.input.data.data_dir = offline_data_dir
  config.evals.test.data.data_dir = offline_data_dir
  config.evals.fewshot.data_dir = offline_data_dir
  del config.evals["attention"]
  results = baselines.compute(config, seeds=(0, 1))

  x_train, y_train = _pixels_and_labels("mnist5k", "train", offline_data_dir)
  x_test, y_test = _pixels_and_labels("mnist5k", config.evals.test.data.split, offline_data_dir)
  # The pipeline scales pixels in float32, this read in float64: a near tie may flip one image.
  reference = np.mean(_numpy_1nn(x_train, y_train, x_test) == y_test)
  assert abs(results["test/pixel_1nn"] - reference) <= 1 / len(y_test)
  assert results["test/pixel_1nn"] > 0.85  # MNIST digits: 1-NN on pixels is a strong baseline
  # Raw pixels through the config's own few-shot probe (digits upsampled to 28 x 28 by its pp):
  # its protocol applied to independently read 8 x 8 digits at their native resolution must be
  # in the same range, not equal (the upsampling changes the features).
  digits_train, digits_labels = _pixels_and_labels("digits", "train", offline_data_dir)
  digits_test, digits_test_labels = _pixels_and_labels("digits", "test", offline_data_dir)
  native = fewshot.fewshot_results(digits_train, digits_labels, digits_test, digits_test_labels,
                                   name="digits", num_classes=10, shots=(10,), seeds=(0, 1, 2),
                                   l2_reg=fewshot.DEFAULT_L2)
  assert abs(results["fewshot/pixels/digits_10shot"] - native["digits_10shot"]) < 0.1
  assert results["fewshot/pixels/digits_10shot"] > 0.6
  # The random networks: one set of numbers per seed, different seeds differ.
  seed0, seed1 = (results[f"fewshot/random_init/seed{s}/digits_10shot"] for s in (0, 1))
  assert 0.1 <= seed0 <= 1 and 0.1 <= seed1 <= 1 and seed0 != seed1

  # The random network's probes: its pre_logits on the independently read pixels, by the numpy
  # references (float64 here, float32 in the pipeline: a near tie may flip an image or two).
  run = run_lib.setup(config)
  params = jax.jit(run.init_state)(jax.random.PRNGKey(1))["params"]

  def embed(x):
    images = x.reshape(-1, 28, 28, 1).astype(np.float32)
    return np.asarray(run.model.apply({"params": params}, images, train=False)[1]["pre_logits"],
                      np.float64)
  f_train, f_test = embed(x_train), embed(x_test)
  for key, predict in (("1nn", _numpy_1nn), ("ridge", _numpy_ridge)):
    got = results[f"test/random_init/seed1/{key}"]
    assert abs(got - np.mean(predict(f_train, y_train, f_test) == y_test)) <= 2 / len(y_test)
    assert 0.5 < got < results["test/pixel_1nn"]  # above chance (0.1), below 1-NN on pixels
  assert results["test/random_init/seed0/ridge"] != results["test/random_init/seed1/ridge"]
  # The reports' reader of this JSON: the seed mean of exactly these keys, nothing else.
  assert baseline_scores.random_init_mean(results, "test/", "/ridge") == pytest.approx(
      (results["test/random_init/seed0/ridge"] + results["test/random_init/seed1/ridge"]) / 2)
  assert baseline_scores.random_init_mean(results, "fewshot/", "/digits_10shot") == (
      pytest.approx((seed0 + seed1) / 2))
  assert baseline_scores.random_init_mean(results, "val/", "/ridge") is None  # no val eval


@pytest.mark.slow
def test_compute_fits_on_the_configs_training_subset(offline_data_dir, monkeypatch):
  """A training split carved by `holdout` (a validation split, then `rest_examples` of the
  rest, as control (b)'s sizes): the probes fit on exactly those records, by an independent
  read of the data and data/holdout.py's selection."""
  from big_vision_relu.data import holdout
  monkeypatch.chdir(ROOT)
  config = sweep.load_config_file("configs/local/mnist_relu.py:runlocal")
  spec = dict(num_examples=500, seed=0, part="rest", rest_examples=600)
  config.input.data.holdout = spec
  config.input.data.data_dir = offline_data_dir
  config.evals.test.data.data_dir = offline_data_dir
  for name in ("attention", "fewshot"):
    del config.evals[name]
  results = baselines.compute(config, seeds=(0,))

  x_all, y_all = _pixels_and_labels("mnist5k", "train", offline_data_dir)
  x_test, y_test = _pixels_and_labels("mnist5k", config.evals.test.data.split, offline_data_dir)
  chosen = holdout.records(y_all, spec)
  assert len(chosen) == 600
  subset = np.mean(_numpy_1nn(x_all[chosen], y_all[chosen], x_test) == y_test)
  whole = np.mean(_numpy_1nn(x_all, y_all, x_test) == y_test)
  assert abs(whole - subset) > 3 / len(y_test)  # the test tells the subset from the whole split
  assert abs(results["test/pixel_1nn"] - subset) <= 1 / len(y_test)
  ridge = np.mean(_numpy_ridge(x_all[chosen], y_all[chosen], x_test) == y_test)
  assert abs(results["test/pixel_ridge"] - ridge) <= 1 / len(y_test)
