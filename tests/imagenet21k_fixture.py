"""Helpers for tests that build `imagenet21k` offline from per-synset tars written by the test."""
import io
import tarfile

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from big_vision_relu.data import datasets, imagenet21k


def photo_jpeg(rng: np.random.Generator, height: int, width: int) -> bytes:
  """A JPEG (tf.io.encode_jpeg) of a photo-like RGB image: smooth colour ramps, a bright disc
  and mild noise, so crops, flips and RandAugment's ops all change pixels."""
  y, x = np.mgrid[0:height, 0:width].astype(np.float32)
  base = rng.uniform(0, 255, 3)
  image = base + np.stack([120 * x / width, 120 * y / height, 60 * (x + y) / (height + width)],
                          axis=-1)
  cy, cx, r = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width, min(height, width) / 4
  image[(y - cy) ** 2 + (x - cx) ** 2 < r ** 2] += 80
  image += rng.normal(0, 8, image.shape)
  pixels = np.clip(image, 0, 255).astype(np.uint8)
  return tf.io.encode_jpeg(pixels, quality=90).numpy()


def add_member(tar: tarfile.TarFile, name: str, data: bytes | None, mtime: int = 0) -> None:
  """Adds a file (or a directory entry if `data` is None) to a tar being written."""
  info = tarfile.TarInfo(name)
  info.mtime = mtime
  if data is None:
    info.type = tarfile.DIRTYPE
  else:
    info.size = len(data)
  tar.addfile(info, None if data is None else io.BytesIO(data))


def write_synset_tars(path, files: dict[str, bytes]):
  """`path`/<wnid>.tar for every wnid of `files` ({'<wnid>/<name>': bytes}), flat members."""
  path.mkdir(parents=True, exist_ok=True)
  for wnid in sorted({name.split("/")[0] for name in files}):
    with tarfile.open(path / f"{wnid}.tar", "w") as tar:
      for name, data in files.items():
        if name.startswith(wnid + "/"):
          add_member(tar, name.split("/")[1], data)
  return path


def build(manual_dir, data_dir, config: imagenet21k.Imagenet21kConfig) -> None:
  """Builds `imagenet21k/<config.name>` into `data_dir` from `manual_dir` (no GCS)."""
  builder = imagenet21k.Imagenet21k(config=config, data_dir=str(data_dir))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=str(manual_dir), try_download_gcs=False))


def records(data_dir, name: str) -> list[bytes]:
  """The serialized examples of `full`, read as the input pipeline does."""
  source = datasets.raw_record_source(datasets.get_builder(name, str(data_dir)), "full")
  return list(source.__getitems__(list(range(len(source)))))


def parse(record: bytes) -> tuple[bytes, int, str]:
  """(image bytes, label, file_name) of a serialized example."""
  feature = tf.train.Example.FromString(record).features.feature
  return (feature["image"].bytes_list.value[0], feature["label"].int64_list.value[0],
          feature["file_name"].bytes_list.value[0].decode())
