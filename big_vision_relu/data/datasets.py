"""Finding TFDS datasets: offline ones are built on first use, all others must be prepared.

`get_builder(name, data_dir)` never touches the network: the offline datasets of
`builders.py` are prepared from local files (mnist5k, digits: shipped in this package;
`fashion_mnist_local`: the IDX files
of Debian's `dataset-fashion-mnist`, `fashion_mnist.py`); any other dataset that is not already
prepared in the data dir raises `DatasetNotPreparedError` at once (instead of TFDS's
multi-minute download attempts), saying where it looked and how to prepare it.

Data dir: the argument, else env `TFDS_DATA_DIR`, else TFDS's default `~/tensorflow_datasets`.
"""
from collections.abc import Mapping, Sequence
import os
from typing import Any

import tensorflow_datasets as tfds

from big_vision_relu.data import builders
from big_vision_relu.data import convert
from big_vision_relu.data import fashion_mnist
from big_vision_relu.data import holdout
from big_vision_relu.data import imagenet21k  # noqa: F401  (registers the builder)
from big_vision_relu.data import manual_sources

# The pipelines read records by number, which TFDS supports for this format only.
RANDOM_ACCESS_FORMAT = tfds.core.file_adapters.FileFormat.ARRAY_RECORD
DATA_KEYS = frozenset({"name", "split", "data_dir", "holdout"})


class DatasetNotPreparedError(FileNotFoundError):
  """The dataset is neither prepared in the data dir nor buildable offline."""


def resolve_data_dir(data_dir: str | None = None) -> str:
  """`data_dir`, else env TFDS_DATA_DIR, else TFDS's default (~/tensorflow_datasets)."""
  return os.fspath(data_dir) if data_dir else tfds.core.constants.get_default_data_dir()


# Builders defined in this package: their own module builds them.
_OWN_BUILD_COMMANDS = {
    "imagenet21k": "python -m big_vision_relu.data.imagenet21k",
    fashion_mnist.NAME: f"python -m big_vision_relu.data.prepare --datasets={fashion_mnist.NAME}",
}


def _build_command(name: str, data_dir: str) -> str:
  base_name = manual_sources.base_name(name)
  if base_name in manual_sources.SOURCES:
    return manual_sources.prepare_command(name, data_dir)
  if base_name in _OWN_BUILD_COMMANDS:
    # imagenet21k/winter2021 -> winter2021; plain imagenet21k is TFDS's default config, fall2011.
    release = name.split(":")[0].partition("/")[2] or "fall2011"
    flag = f" --release={release}" if base_name == "imagenet21k" else ""
    return f"{_OWN_BUILD_COMMANDS[base_name]}{flag} --data_dir={data_dir}"
  # Not `tfds build`: TFDS 4.9's CLI does not start without apache_beam.
  return (f"python -m big_vision_relu.data.prepare --download --datasets={name} "
          f"--data_dir={data_dir}")


def prepare(builder: tfds.core.DatasetBuilder) -> None:
  """Builds a local-source dataset as ArrayRecord files (never tries TFDS's GCS mirror)."""
  builder.download_and_prepare(
      file_format=builders.DEFAULT_FILE_FORMAT,
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))


def get_builder(name: str, data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """Returns a prepared builder for the TFDS dataset `name` (e.g. 'cifar100', 'mnist5k:1.0.0').

  Offline datasets (`builders.OFFLINE_DATASETS`) are prepared into the data dir on first use,
  `fashion_mnist_local` too if Debian's files are installed. Anything else must already be
  prepared there; otherwise this raises `DatasetNotPreparedError` within a second, with the
  command that prepares it.
  """
  data_dir = resolve_data_dir(data_dir)
  base_name = manual_sources.base_name(name)
  if base_name == fashion_mnist.NAME:
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
      try:
        fashion_mnist.check_sources(builder.source_dir)
      except fashion_mnist.SourceError as error:
        raise DatasetNotPreparedError(
            f"Dataset {name!r} is not prepared in data_dir={data_dir!r} and cannot be built "
            f"from {builder.source_dir}: {error} Then run "
            f"{_build_command(name, data_dir)} (add --fashion_mnist_dir=DIR for files "
            "elsewhere).") from None
      prepare(builder)
    return builder
  if base_name in builders.OFFLINE_DATASETS:
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
      prepare(builder)
    return builder

  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise DatasetNotPreparedError(
        f"Dataset {name!r} is not prepared in data_dir={data_dir!r} and no TFDS builder is "
        f"registered under that name. Pass data_dir / set TFDS_DATA_DIR to where it is "
        f"prepared, or import the module defining its builder and run "
        f"{_build_command(name, data_dir)} (offline datasets here: "
        f"{', '.join(builders.OFFLINE_DATASETS)})") from None
  if not builder.is_prepared():
    manual = getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
    if base_name in manual_sources.SOURCES:
      how = (f"It needs a manual download first: "
             f"{manual_sources.instructions(name)}\nthen run: {_build_command(name, data_dir)}"
             f" (on Google Cloud: {manual_sources.data_sh_command(name)})")
    elif manual:
      how = (f"It needs a manual download first:\n{manual.strip()}\nthen run: "
             f"{_build_command(name, data_dir)} --manual_dir=DIR_WITH_THE_FILES")
    else:
      how = f"On a machine with network run: {_build_command(name, data_dir)}"
    raise DatasetNotPreparedError(
        f"Dataset {name!r} is not prepared in data_dir={data_dir!r} (looked for "
        f"{builder.data_dir}); this project never downloads during training. Pass data_dir / "
        f"set TFDS_DATA_DIR to where it is prepared, or prepare it. {how}")
  return builder


def check_prepared(names: Sequence[tuple[str, str | None]]) -> None:
  """Raises one DatasetNotPreparedError listing EVERY dataset of `names` that is not prepared,
  each with the command that prepares it, instead of one per run attempt (a paper config
  reads 11). Offline datasets are built on the way, as get_builder does."""
  problems = []
  for name, data_dir in dict.fromkeys(names):
    try:
      get_builder(name, data_dir)
    except DatasetNotPreparedError as error:
      problems.append(f"- {error}")
  if problems:
    raise DatasetNotPreparedError(
        f"{len(problems)} of the {len(dict.fromkeys(names))} datasets this run reads are not "
        "prepared; prepare them all, then run again:\n" + "\n".join(problems))


def check_data_spec(data: Mapping[str, Any]) -> None:
  """Raises ValueError unless `data` is {name, split[, data_dir][, holdout]} (the config's
  `input.data`; holdout: data/holdout.py)."""
  unknown = set(data) - DATA_KEYS
  missing = {"name", "split"} - set(data)
  if unknown or missing:
    raise ValueError(f"data spec {dict(data)} must have keys name, split and optionally "
                     f"data_dir, holdout; unknown: {sorted(unknown)}, missing: {sorted(missing)}")
  holdout.check_spec("data.holdout", data.get("holdout"))


def num_examples(data: Mapping[str, Any]) -> int:
  """Number of examples in `data['split']` (TFDS split syntax, e.g. 'train[:99%]'), or in its
  `holdout` part."""
  check_data_spec(data)
  builder = get_builder(data["name"], data.get("data_dir"))
  return holdout.part_size(builder.info.splits[data["split"]].num_examples, data.get("holdout"))


def label_key(builder: tfds.core.DatasetBuilder) -> str:
  """The feature holding a dataset's class label: its supervised label, else 'label'."""
  keys = builder.info.supervised_keys
  return keys[1] if keys and isinstance(keys[1], str) else "label"


def raw_record_source(builder: tfds.core.DatasetBuilder, split: str) -> Sequence[bytes]:
  """Random-access sequence of the serialized `tf.train.Example`s of `split`, in TFDS order.

  Also has `__getitems__(indices)`, which reads many records in one call (in parallel).

  Raises ValueError (with the conversion command) if the dataset has no ArrayRecord files.
  """
  formats = builder.info.available_file_formats()
  if RANDOM_ACCESS_FORMAT not in formats:
    # TFDS 4.9 restores the alternative formats of dataset_info.json (an in-place conversion
    # adds ArrayRecord there) only for a builder read from the files, not a registered one.
    from_files = tfds.builder_from_directory(builder.data_dir)
    if RANDOM_ACCESS_FORMAT in from_files.info.available_file_formats():
      builder, formats = from_files, from_files.info.available_file_formats()
  if RANDOM_ACCESS_FORMAT not in formats:
    full_name = builder.info.full_name  # name[/config]/version
    root = os.fspath(builder.data_dir)[:-len(full_name)].rstrip("/")
    name, _, version = full_name.rpartition("/")
    raise ValueError(
        f"Dataset {full_name} in {builder.data_dir} is stored as "
        f"{sorted(f.value for f in formats)}, but the input pipeline reads records by index, "
        f"which needs {RANDOM_ACCESS_FORMAT.value}. Convert it (in place, in parallel, record "
        f"counts checked; --out_data_dir=DIR to write elsewhere) with: "
        f"{convert.command(f'{name}:{version}', root)}")
  return builder.as_data_source(
      split, file_format=RANDOM_ACCESS_FORMAT,
      deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
