r"""TFDS datasets whose download no longer works, built from files fetched by hand.

    python -m big_vision_relu.data.prepare --datasets=cars196 --manual_dir=DIR \
        [--data_dir=gs://BUCKET/tensorflow_datasets] [--download_dir=LOCAL_DIR]

`cars196`: TFDS's URLs (ai.stanford.edu/~jkrause) have answered 404 since 2023
(tensorflow/datasets#5053, pytorch/vision#7545), and no other source serves these exact files
under a stable address. `caltech_birds2011`: TFDS >= 4.9.9 downloads it from CaltechDATA,
which works; older TFDS releases pointed at a Google Drive file whose daily download quota is
often spent, so the same files can also be given by hand.

The files are the ones TFDS's own builder expects (its `url_checksums/<name>.txt` lists each
URL with its size and sha256; the numbers below are copied from tensorflow-datasets 4.9.10):
TFDS looks for each one by file name in the manual dir (a local directory or gs://...). Every
file is checked here first, sizes before contents, and all problems are reported together,
each with where to get the file, before anything is built.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

import tensorflow as tf
import tensorflow_datasets as tfds

_CHUNK = 16 << 20  # bytes hashed per read (large: the manual dir may be on GCS)


@dataclasses.dataclass(frozen=True)
class SourceFile:
  """One file of a manual download: its name in the manual dir, size, sha256 and origin."""
  name: str
  size: int
  sha256: str
  where: str  # where to get it today


@dataclasses.dataclass(frozen=True)
class ManualSource:
  """The files one TFDS dataset is built from, and why they are fetched by hand."""
  files: tuple[SourceFile, ...]
  why: str
  note: str  # a last hint for the user
  tfds_downloads: bool = False  # TFDS's own download still works (`prepare --download`)


# The Internet Archive's copy of the original (dead) URL; the Archive redirects to its capture.
_WAYBACK = "https://web.archive.org/web/2021/"
_CARS = _WAYBACK + "http://ai.stanford.edu/~jkrause/car196/"
SOURCES: Mapping[str, ManualSource] = {
    "cars196": ManualSource(
        why=("TFDS's download URLs (ai.stanford.edu/~jkrause) answer 404 since 2023 "
             "(tensorflow/datasets#5053)"),
        files=(
            SourceFile("car_devkit.tgz", 330960,
                       "b97deb463af7d58b6bfaa18b2a4de9829f0f79e8ce663dfa9261bf7810e9accd",
                       "https://github.com/pytorch/vision/files/11644847/car_devkit.tgz "
                       "(attached to pytorch/vision#7545), or " + _WAYBACK +
                       "https://ai.stanford.edu/~jkrause/cars/car_devkit.tgz"),
            SourceFile("cars_train.tgz", 979269282,
                       "512b227b30e2f0a8aab9e09485786ab4479582073a144998da74d64b801fd288",
                       _CARS + "cars_train.tgz"),
            SourceFile("cars_test.tgz", 977350468,
                       "bffea656d6f425cba3c91c6d83336e4c5f86c6cffd8975b0f375d3a10da8e243",
                       _CARS + "cars_test.tgz"),
            SourceFile("cars_test_annos_withlabels.mat", 185758,
                       "790f75be8ea34eeded134cc559332baf23e30e91367e9ddca97d26ed9b895f05",
                       "the copy linked from "
                       "https://github.com/pytorch/vision/issues/7545#issuecomment-1631441616, "
                       "or " +
                       _CARS + "cars_test_annos_withlabels.mat"),
        ),
        note="Kaggle's Stanford Cars copies hold unpacked images, not these archives: they "
             "do not pass."),
    "caltech_birds2011": ManualSource(
        why=("TFDS downloads it from CaltechDATA (`python -m big_vision_relu.data.prepare "
             "--download --datasets=caltech_birds2011`); use these steps when that fails "
             "(releases before 4.9.9 used a quota-limited Google Drive file)"),
        tfds_downloads=True,
        files=(
            SourceFile("CUB_200_2011.tgz", 1150585339,
                       "0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081",
                       "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz"
                       "?download=1"),
            SourceFile("segmentations.tgz", 39272883,
                       "dc77f6cffea0cbe2e41d4201115c8f29a6320ecb04fffd2444f51b8066e4b84f",
                       "https://data.caltech.edu/records/w9d68-gec53/files/segmentations.tgz"
                       "?download=1"),
        ),
        note="Save each under its name, e.g. wget -O CUB_200_2011.tgz 'URL'."),
}


class ManualSourceError(FileNotFoundError):
  """A file of a manual download is missing, of the wrong size or of the wrong sha256."""


def base_name(name: str) -> str:
  """'cars196:2.1.0' -> 'cars196'."""
  return name.split("/")[0].split(":")[0]


def prepare_command(name: str, data_dir: str, manual_dir: str = "DIR_WITH_THE_FILES") -> str:
  return (f"python -m big_vision_relu.data.prepare --datasets={name} --manual_dir={manual_dir} "
          f"--data_dir={data_dir}")


def data_sh_command(name: str) -> str:
  """The launch/tpu/data.sh line that verifies and builds `name` on a CPU VM."""
  return (f"{base_name(name).upper()}_MANUAL_DIR=gs://BUCKET/DIR_WITH_THE_FILES "
          f"bash launch/tpu/data.sh {name}")


def instructions(name: str) -> str:
  """How to fetch `name`'s files by hand: one line per file with size, sha256 and origin."""
  source = SOURCES[base_name(name)]
  lines = [f"{base_name(name)} from files fetched by hand ({source.why}): put these files, "
           "byte for byte (the sha256 is checked), into one directory (local or gs://...):"]
  lines += [f"  {f.name}  {f.size} bytes  sha256 {f.sha256}\n    from {f.where}"
            for f in source.files]
  lines.append(f"  {source.note}")
  return "\n".join(lines)


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with tf.io.gfile.GFile(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
  return digest.hexdigest()


def verify(name: str, manual_dir: str,
           files: Sequence[SourceFile] | None = None) -> None:
  """Checks that `manual_dir` holds `name`'s files (default: `SOURCES[name].files`).

  Sizes first (a missing or truncated file fails in a second), then each sha256 (reads ~2 GB
  for cars196). Raises ManualSourceError naming every bad file and where to get it.
  """
  files = SOURCES[base_name(name)].files if files is None else files
  manual_dir = manual_dir.rstrip("/")
  problems = []  # (file, what is wrong with it)
  for f in files:
    path = f"{manual_dir}/{f.name}"
    if not tf.io.gfile.exists(path):
      problems.append((f, f"{path} is missing"))
    elif (size := tf.io.gfile.stat(path).length) != f.size:
      problems.append((f, f"{path} has {size} bytes, expected {f.size}"))
  if not problems:
    for f in files:
      path = f"{manual_dir}/{f.name}"
      if (digest := _sha256(path)) != f.sha256:
        problems.append((f, f"{path} has sha256 {digest}, expected {f.sha256} (another "
                            "release or a damaged copy)"))
  if problems:
    raise ManualSourceError(
        f"{base_name(name)}: the manual download in {manual_dir} is not usable:\n" +
        "\n".join(f"- {what}; get {f.name} from {f.where}" for f, what in problems) +
        "\nFix them, then run the same command again.")


def build(name: str, data_dir: str, manual_dir: str,
          download_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """Verifies the manual files, then builds `name` as ArrayRecord into `data_dir`.

  `download_dir` is where TFDS extracts the archives (default `<data_dir>/downloads`; a local
  disk is much faster than a bucket for the tens of thousands of small files).
  """
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    verify(name, manual_dir)
    builder.download_and_prepare(
        file_format="array_record", download_dir=download_dir,
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir,
                                                     try_download_gcs=False))
  return builder
