r"""Builds the offline datasets (no network) into a TFDS data dir.

    python -m big_vision_relu.data.prepare [--data_dir DIR] [--datasets mnist5k,digits]

Run it once before a multi-host job that shares a data dir, so hosts do not race to build.
Other datasets must be prepared with `tfds build` on a machine with network (the error of any
pipeline that needs one says exactly how).
"""
from absl import app, flags

import big_vision_relu  # noqa: F401  (quiets TensorFlow)
from big_vision_relu.data import builders, datasets

_DATASETS = flags.DEFINE_list("datasets", list(builders.OFFLINE_DATASETS),
                              "Offline datasets to build.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data dir (default: TFDS_DATA_DIR or "
                                "~/tensorflow_datasets).")


def main(argv: list[str]) -> None:
  del argv
  for name in _DATASETS.value:
    if name not in builders.OFFLINE_DATASETS:
      raise app.UsageError(f"{name!r} is not an offline dataset; valid: "
                           f"{', '.join(builders.OFFLINE_DATASETS)}.")
    builder = datasets.get_builder(name, _DATA_DIR.value)
    splits = ", ".join(f"{k}: {v.num_examples}" for k, v in builder.info.splits.items())
    print(f"{name}: {builder.data_dir} ({splits})")


if __name__ == "__main__":
  app.run(main)
