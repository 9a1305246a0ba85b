"""Fashion-MNIST from local IDX files: a fixture the test writes, Debian's real files, and the
errors for missing or wrong ones."""
import gzip
import hashlib
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds
from conftest import ROOT

from big_vision_relu.data import arrays, datasets, fashion_mnist, holdout, input_pipeline


def _write_idx(path: pathlib.Path, array: np.ndarray) -> str:
  """Writes a gzipped uint8 IDX file (big-endian header: magic 0x08 0x0{ndim}, then dims);
  returns the sha256 of its contents."""
  header = np.array([0x0800 + array.ndim, *array.shape], ">u4").tobytes()
  contents = header + array.astype(np.uint8).tobytes()
  path.write_bytes(gzip.compress(contents))
  return hashlib.sha256(contents).hexdigest()


@pytest.fixture
def fixture_dir(tmp_path):
  """12 train and 5 test images with labels; returns (dir, {split: (images, labels)}, sha256)."""
  rng = np.random.default_rng(0)
  arrays, sha256 = {}, {}
  for split, n in (("train", 12), ("test", 5)):
    images = rng.integers(0, 256, (n, 28, 28), np.uint8)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images_file, labels_file = fashion_mnist.FILES[split]
    sha256[images_file] = _write_idx(tmp_path / images_file, images)
    sha256[labels_file] = _write_idx(tmp_path / labels_file, labels)
    arrays[split] = (images, labels)
  return tmp_path, arrays, sha256


def _read(builder, split):
  source = builder.as_data_source(split)
  examples = source.__getitems__(list(range(len(source))))
  return (np.stack([e["image"] for e in examples]), np.array([e["label"] for e in examples]),
          np.array([e["index"] for e in examples]))


def test_builds_the_fixture_as_arrayrecord_with_every_example_in_place(fixture_dir, tmp_path):
  source, arrays, sha256 = fixture_dir
  builder = tfds.builder(fashion_mnist.NAME, data_dir=str(tmp_path / "tfds"),
                         source_dir=str(source), source_sha256=sha256)
  datasets.prepare(builder)
  assert builder.info.file_format == tfds.core.file_adapters.FileFormat.ARRAY_RECORD
  assert builder.info.features["label"].names == list(fashion_mnist.CLASS_NAMES)
  for split, (images, labels) in arrays.items():
    got_images, got_labels, index = _read(builder, split)
    assert sorted(index) == list(range(len(labels)))
    np.testing.assert_array_equal(got_images[..., 0], images[index])
    np.testing.assert_array_equal(got_labels, labels[index])


def test_a_wrong_or_missing_file_fails_before_anything_is_written(fixture_dir, tmp_path):
  source, _, sha256 = fixture_dir
  wrong = {**sha256, "t10k-labels-idx1-ubyte.gz": "0" * 64}
  data_dir = tmp_path / "tfds"
  builder = tfds.builder(fashion_mnist.NAME, data_dir=str(data_dir), source_dir=str(source),
                         source_sha256=wrong)
  with pytest.raises(fashion_mnist.SourceError, match=r"t10k-labels-idx1-ubyte.gz: the sha256 .* "
                     r"expected 0{64}.*Fix: put the four files"):
    datasets.prepare(builder)
  assert not builder.is_prepared()
  (source / "train-images-idx3-ubyte.gz").unlink()
  with pytest.raises(fashion_mnist.SourceError, match="train-images-idx3-ubyte.gz is missing"):
    fashion_mnist.check_sources(str(source), sha256)
  # The same through the command users run: exit 1 with the message, nothing built.
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  result = subprocess.run(
      [sys.executable, "-m", "big_vision_relu.data.prepare", "--datasets",
       fashion_mnist.NAME, f"--data_dir={data_dir}", f"--fashion_mnist_dir={source}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 1
  assert "Cannot build fashion_mnist_local" in result.stderr
  assert "train-images-idx3-ubyte.gz is missing" in result.stderr
  assert not (data_dir / fashion_mnist.NAME).exists() or not any(
      (data_dir / fashion_mnist.NAME).rglob("*.array_record*"))


def test_debian_files_missing_name_the_apt_command(tmp_path, monkeypatch):
  monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", str(tmp_path / "absent"))
  with pytest.raises(fashion_mnist.SourceError, match="Fix: apt-get install dataset-fashion-mnist"):
    fashion_mnist.check_sources(fashion_mnist.DEBIAN_DIR)


def _debian_files_present() -> bool:
  return all((pathlib.Path(fashion_mnist.DEBIAN_DIR) / f).exists() for f in fashion_mnist.SHA256)


@pytest.mark.slow
@pytest.mark.skipif(not _debian_files_present() and not os.environ.get("CI"),
                    reason="needs `apt-get install dataset-fashion-mnist` (CI installs it)")
def test_the_real_files_build_60000_train_and_10000_test_read_alike_in_memory(tmp_path):
  builder = datasets.get_builder(fashion_mnist.NAME, str(tmp_path))
  assert {s: builder.info.splits[s].num_examples for s in ("train", "test")} == {
      "train": 60_000, "test": 10_000}
  for split, per_class in (("train", 6000), ("test", 1000)):
    # An independent read of the IDX file: 16-byte header, then row-major pixels.
    with gzip.open(pathlib.Path(fashion_mnist.DEBIAN_DIR) / fashion_mnist.FILES[split][0]) as f:
      raw = np.frombuffer(f.read()[16:], np.uint8).reshape(-1, 28, 28)
    source = builder.as_data_source(split)
    picks = [0, 1, len(source) // 2, len(source) - 1]
    for example in source.__getitems__(picks):
      np.testing.assert_array_equal(example["image"][..., 0], raw[example["index"]])
    # Every label, from records whose images are left encoded (decoding 70,000 PNGs: ~20 s).
    undecoded = builder.as_data_source(split, decoders={"image": tfds.decode.SkipDecoding()})
    labels = np.array([e["label"] for e in undecoded.__getitems__(list(range(len(source))))])
    np.testing.assert_array_equal(np.bincount(labels, minlength=10), [per_class] * 10)
    # The in-memory path (data/arrays.py) reads the same records in the same order ...
    in_memory = arrays.load(dict(name=fashion_mnist.NAME, split=split))
    np.testing.assert_array_equal(in_memory.labels, labels)
    for number, example in zip(picks, source.__getitems__(picks)):
      np.testing.assert_array_equal(in_memory.images[number], example["image"])
  # ... and carves the same validation split from them.
  spec = dict(num_examples=5000, seed=0, part="held_out")
  tfds_numbers = input_pipeline._holdout_numbers(fashion_mnist.NAME, "train", str(tmp_path),
                                                 **spec)
  labels = arrays.load(dict(name=fashion_mnist.NAME, split="train")).labels
  np.testing.assert_array_equal(holdout.records(labels, spec), tfds_numbers)
  held_out = arrays.load(dict(name=fashion_mnist.NAME, split="train", holdout=spec))
  np.testing.assert_array_equal(held_out.labels, labels[tfds_numbers])
  assert len(tfds_numbers) == 5000
  # Control (b)'s training subsets (rest_examples), the same way on both paths.
  subset = dict(spec, part="rest", rest_examples=7500)
  tfds_subset = input_pipeline._holdout_numbers(fashion_mnist.NAME, "train", str(tmp_path),
                                                **subset)
  np.testing.assert_array_equal(holdout.records(labels, subset), tfds_subset)
  in_memory = arrays.load(dict(name=fashion_mnist.NAME, split="train", holdout=subset))
  np.testing.assert_array_equal(in_memory.labels, labels[tfds_subset])
  assert np.bincount(labels[tfds_subset]).tolist() == [750] * 10
  assert not np.isin(tfds_subset, tfds_numbers).any()
