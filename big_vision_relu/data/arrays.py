"""In-memory datasets: the offline datasets as numpy arrays, in the record order of their TFDS
builds. numpy only: no TensorFlow, TFDS, mlxtend or scikit-learn.

    split = arrays.load(dict(name="fashion_mnist_local", split="train[:64]"))
    split.images  # uint8 [64, 28, 28, 1]      split.labels  # int64 [64]

Datasets (the TFDS path's names; features `image` and `label`):
  fashion_mnist_local  Fashion-MNIST, 60,000 train / 10,000 test, from its IDX files in
                       `data_dir` when given, else Debian's /usr/share/datasets/fashion-mnist
                       (`apt-get install dataset-fashion-mnist`); sha256-checked
                       (fashion_mnist.py)
  mnist5k              4,000 train / 1,000 test, from `files/mnist_5k.csv.gz`
  digits               1,438 train / 359 test 8x8 digits, from `files/digits.csv.gz`
The last two ship in this package (`files/README.md`: where from, licences, sha256) and take
no `data_dir`. Splits and pixel values are those of the TFDS builders (builders.py).

Record order: record r of a split here is record r of its TFDS build. TFDS's writer stores a
split's examples sorted by the md5 of the split's name followed by the example's key
(`tensorflow_datasets/core/hashing.py`, which keeps that hash fixed because changing it would
reorder every dataset); the builders' keys are source rows, so the order is computed here from
the rows alone. Split slices (`test[:32]`), holdout parts (`holdout.records` of the labels in
record order) and `_record` numbers thus select the same examples on both input paths
(tests/test_memory_pipeline.py compares them with TFDS builds).

Split syntax (TFDS's, the part of it these datasets need): `name` or `name[from:to]`, bounds
counted in records (negative: from the end) or in percent (`train[:10%]`, rounded to the closest
record as TFDS does).
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import importlib.resources
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from big_vision_relu.data import fashion_mnist
from big_vision_relu.data import holdout

MNIST5K, DIGITS = "mnist5k", "digits"
NAMES = (fashion_mnist.NAME, MNIST5K, DIGITS)
NUM_CLASSES = 10  # all three
# sha256 of the shipped files (files/README.md).
FILE_SHA256 = {
    "mnist_5k.csv.gz": "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d",
    "digits.csv.gz": "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22",
}
_SPLIT = re.compile(r"^(?P<name>[\w-]+)(\[(?P<start>[^:\]]*):(?P<stop>[^:\]]*)\])?$")
_BOUND = re.compile(r"^(?P<value>-?[\d.]+)(?P<percent>%?)$")


@dataclasses.dataclass(frozen=True)
class Split:
  """One split in record order: images uint8 [n, h, w, c], labels int64 [n] (read-only)."""
  images: np.ndarray
  labels: np.ndarray

  def __len__(self) -> int:
    return len(self.labels)


def _read_shipped(file_name: str) -> np.ndarray:
  """The table of one shipped csv.gz file (int64 [rows, columns]), its sha256 checked."""
  data = (importlib.resources.files("big_vision_relu.data") / "files" / file_name).read_bytes()
  digest = hashlib.sha256(data).hexdigest()
  if digest != FILE_SHA256[file_name]:
    raise ValueError(f"big_vision_relu/data/files/{file_name} has sha256 {digest}, expected "
                     f"{FILE_SHA256[file_name]}: the package is damaged; reinstall it.")
  return np.loadtxt(gzip.decompress(data).decode().splitlines(), delimiter=",",
                    dtype=np.float64).astype(np.int64)


def mnist5k_source() -> tuple[np.ndarray, np.ndarray]:
  """`mnist_5k.csv.gz`: 5,000 rows of 784 pixels (row-major 28x28) + label.

  Returns images uint8 [5000, 28, 28, 1] and labels int64 [5000], in file order.
  """
  table = _read_shipped("mnist_5k.csv.gz")
  if table.shape != (5000, 785) or table.min() < 0 or table[:, :784].max() > 255:
    raise ValueError(f"mnist_5k.csv.gz is not 5000 rows of 784 uint8 pixels + label: "
                     f"{table.shape}")
  return table[:, :784].astype(np.uint8).reshape(5000, 28, 28, 1), table[:, 784]


def mnist5k_split_rows(labels: np.ndarray) -> dict[str, np.ndarray]:
  """The fixed split: per class, the first 400 rows (file order) train, the other 100 test."""
  rank_in_class = np.zeros(len(labels), np.int64)
  for c in np.unique(labels):
    rows = np.flatnonzero(labels == c)
    rank_in_class[rows] = np.arange(len(rows))
  return {"train": np.flatnonzero(rank_in_class < 400),
          "test": np.flatnonzero(rank_in_class >= 400)}


def digits_source() -> tuple[np.ndarray, np.ndarray]:
  """`digits.csv.gz` (what scikit-learn's `load_digits` reads) as uint8 images.

  Pixel values 0..16 map to uint8 by `(v * 255 + 8) // 16` (rounding, half up), so 0 -> 0 and
  16 -> 255. Returns images uint8 [1797, 8, 8, 1] and labels int64 [1797], in file order.
  """
  table = _read_shipped("digits.csv.gz")
  values = table[:, :64]
  if table.shape != (1797, 65) or values.min() < 0 or values.max() > 16:
    raise ValueError(f"digits.csv.gz is not 1797 rows of 64 pixels in 0..16 + label: "
                     f"{table.shape}")
  images = ((values * 255 + 8) // 16).astype(np.uint8).reshape(1797, 8, 8, 1)
  return images, table[:, 64]


def digits_split_rows(num_rows: int) -> dict[str, np.ndarray]:
  """The fixed split: row i is test if i % 5 == 4, else train (1438 train / 359 test)."""
  rows = np.arange(num_rows)
  return {"train": rows[rows % 5 != 4], "test": rows[rows % 5 == 4]}


def tfds_record_order(split_name: str, keys: np.ndarray) -> np.ndarray:
  """The positions in `keys` (the examples' int keys) in the order TFDS stores the split."""
  salt = hashlib.md5(split_name.encode())

  def hashed(key: int) -> int:
    md5 = salt.copy()
    md5.update(str(int(key)).encode())
    return int(md5.hexdigest(), 16)
  return np.array(sorted(range(len(keys)), key=lambda i: hashed(keys[i])), np.int64)


@functools.lru_cache(maxsize=8)
def _whole_split(name: str, split_name: str, data_dir: str | None) -> Split:
  """A whole split in record order, read once per process."""
  if name == fashion_mnist.NAME:
    if split_name not in fashion_mnist.FILES:
      raise ValueError(f"{name} has splits {', '.join(fashion_mnist.FILES)}, not "
                       f"{split_name!r}.")
    images, labels = fashion_mnist.load_split(data_dir or fashion_mnist.DEBIAN_DIR, split_name)
    rows = np.arange(len(labels))
  else:
    images, labels = mnist5k_source() if name == MNIST5K else digits_source()
    splits = mnist5k_split_rows(labels) if name == MNIST5K else digits_split_rows(len(labels))
    if split_name not in splits:
      raise ValueError(f"{name} has splits {', '.join(splits)}, not {split_name!r}.")
    rows = splits[split_name]
  rows = rows[tfds_record_order(split_name, rows)]
  images, labels = images[rows], labels[rows]
  images.setflags(write=False)
  labels.setflags(write=False)
  return Split(images, labels)


def _bound(text: str, num_examples: int, percent: bool, spec: str) -> int:
  try:
    value = float(text) if percent else int(text)
  except ValueError:
    raise ValueError(f"Split {spec!r}: {text!r} is not a whole number of records (or give "
                     "percents, e.g. 'train[:10%]').") from None
  if percent:
    value = int(round(value * num_examples / 100.0))
  if abs(value) > num_examples:
    raise ValueError(f"Split {spec!r} reaches past the {num_examples} examples of its split.")
  return value + num_examples if value < 0 else value


def _slice(spec: str) -> tuple[str, slice | None, bool]:
  """'train[10:20]' -> ('train', bounds as written, percent?)."""
  match = _SPLIT.match(spec.replace(" ", ""))
  bounds = [] if match is None or match["start"] is None else [match["start"], match["stop"]]
  parsed = [_BOUND.match(b) for b in bounds if b]
  if match is None or not all(parsed) or (bounds and not parsed):
    raise ValueError(f"Split {spec!r} is not `name` or `name[from:to]` (records or percents, "
                     "e.g. 'train[:1000]', 'test[10%:]'); the in-memory datasets take no '+', "
                     "'all' or shard slices.")
  percent = any(p["percent"] for p in parsed)
  return match["name"], (slice(*bounds) if bounds else None), percent


def split_records(spec: str, num_examples: int) -> np.ndarray:
  """The record numbers (ascending int64) that a split spec such as 'train[:10%]' selects from
  a split of `num_examples` records."""
  _, bounds, percent = _slice(spec)
  if bounds is None:
    return np.arange(num_examples, dtype=np.int64)
  start = 0 if not bounds.start else _bound(bounds.start.rstrip("%"), num_examples, percent, spec)
  stop = (num_examples if not bounds.stop
          else _bound(bounds.stop.rstrip("%"), num_examples, percent, spec))
  return np.arange(start, max(start, stop), dtype=np.int64)


def check_name(name: str) -> None:
  if name not in NAMES:
    raise ValueError(f"Dataset {name!r} is not one of the in-memory datasets "
                     f"({', '.join(NAMES)}); use input.pipeline='tfds' for TFDS datasets.")


def load(data: Mapping[str, Any]) -> Split:
  """The split (or its holdout part) of a data spec {name, split[, data_dir][, holdout]}.

  Raises ValueError for an unknown dataset or split, fashion_mnist.SourceError (with the fix)
  when Fashion-MNIST's files are missing or not the expected ones.
  """
  check_name(data["name"])
  data_dir = data.get("data_dir") if data["name"] == fashion_mnist.NAME else None
  spec = data.get("holdout")
  return _load(data["name"], data["split"], data_dir,
               None if spec is None else tuple(sorted(spec.items())))


@functools.lru_cache(maxsize=8)
def _load(name: str, split: str, data_dir: str | None,
          holdout_items: tuple[tuple[str, Any], ...] | None) -> Split:
  """`load`, once per process: the trainer and its evaluators share the arrays."""
  whole = _whole_split(name, _slice(split)[0], data_dir)
  records = split_records(split, len(whole))
  if len(records) == 0:
    raise ValueError(f"Split {split!r} of {name} has no examples")
  if holdout_items is not None:
    records = records[holdout.records(whole.labels[records], dict(holdout_items))]
  elif len(records) == len(whole):
    return whole
  images, labels = whole.images[records], whole.labels[records]
  images.setflags(write=False)
  labels.setflags(write=False)
  return Split(images, labels)
