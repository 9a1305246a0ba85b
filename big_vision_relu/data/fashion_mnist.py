r"""Fashion-MNIST's local IDX files, read and checked with numpy: the source of the TFDS dataset
`fashion_mnist_local` (builders.FashionMnistLocal) and of the in-memory one (arrays.py).

    apt-get install dataset-fashion-mnist          # Debian: /usr/share/datasets/fashion-mnist/
    python -m big_vision_relu.data.prepare --datasets fashion_mnist_local [--fashion_mnist_dir D]

60,000 train / 10,000 test images, uint8 (28, 28, 1), 10 classes (TFDS's `fashion_mnist`
features and class names; the TFDS build adds `index`: the example's row in its IDX file).

TFDS's own `fashion_mnist` builder cannot be fed these files: it checks the sha256 of the
upstream `.gz` files, and Debian's are recompressed (same contents, other bytes). So the files
are checked for what matters, the sha256 of each file's decompressed IDX contents, which is the
same for Debian's and the upstream files. A missing or wrong file fails before anything is
written, with the command that fixes it.
"""
from __future__ import annotations

import gzip
import hashlib
import pathlib
from collections.abc import Mapping

import numpy as np

DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
NAME = "fashion_mnist_local"
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot")
# split -> (images file, labels file)
FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
# sha256 of each file's decompressed contents (identical in Debian's package and upstream).
SHA256 = {
    "train-images-idx3-ubyte.gz":
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte.gz":
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte.gz":
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte.gz":
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
_IDX_MAGIC = {3: 0x00000803, 1: 0x00000801}  # uint8 data, 3 or 1 dimensions


class SourceError(FileNotFoundError):
  """A Fashion-MNIST source file is missing, corrupt or not the expected one."""


def fix_command(directory: str) -> str:
  if directory == DEBIAN_DIR:
    return "apt-get install dataset-fashion-mnist"
  return (f"put the four files {', '.join(SHA256)} into {directory}, or install them with "
          f"`apt-get install dataset-fashion-mnist` and pass --fashion_mnist_dir={DEBIAN_DIR}")


def read_idx(path: pathlib.Path, dims: int, expected_sha256: str | None) -> np.ndarray:
  """The uint8 array of a gzipped IDX file with `dims` dimensions, its contents' sha256 checked.

  Raises SourceError (naming the file and the fix) if it is missing, not gzip, of the wrong
  checksum or not an IDX array of that rank.
  """
  directory = str(path.parent)
  if not path.is_file():
    raise SourceError(f"Fashion-MNIST file {path} is missing. Fix: {fix_command(directory)}.")
  try:
    with gzip.open(path, "rb") as f:
      data = f.read()
  except (OSError, EOFError) as error:
    raise SourceError(f"{path} is not a readable gzip file ({error}). Fix: "
                      f"{fix_command(directory)}.") from None
  digest = hashlib.sha256(data).hexdigest()
  if expected_sha256 is not None and digest != expected_sha256:
    raise SourceError(f"{path}: the sha256 of its decompressed contents is {digest}, expected "
                      f"{expected_sha256} (a different or damaged file). Fix: "
                      f"{fix_command(directory)}.")
  header = np.frombuffer(data[:4 * (dims + 1)], ">u4")
  shape = tuple(int(n) for n in header[1:])
  if len(header) != dims + 1 or header[0] != _IDX_MAGIC[dims] or len(data) != 4 * (
      dims + 1) + int(np.prod(shape)):
    raise SourceError(f"{path} is not a uint8 IDX file of {dims} dimensions.")
  return np.frombuffer(data, np.uint8, offset=4 * (dims + 1)).reshape(shape)


def load_split(directory: str, split: str,
               sha256: Mapping[str, str | None] = SHA256) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [n, 28, 28, 1], labels int64 [n]) of `split` from the IDX files in
  `directory`; `sha256`: expected checksums by file name (None: unchecked, for fixtures)."""
  images_file, labels_file = FILES[split]
  root = pathlib.Path(directory)
  images = read_idx(root / images_file, 3, sha256.get(images_file))
  labels = read_idx(root / labels_file, 1, sha256.get(labels_file)).astype(np.int64)
  if images.shape[1:] != (28, 28) or len(images) != len(labels) or labels.max() > 9:
    raise SourceError(f"{directory}: {split} images {images.shape} and labels {labels.shape} "
                      "are not n 28x28 images with n labels in 0..9.")
  return images[..., None], labels


def check_sources(directory: str, sha256: Mapping[str, str | None] = SHA256) -> None:
  """Reads and checks all four files now (about a second), before any builder writes."""
  for split in FILES:
    load_split(directory, split, sha256)
