r"""Converts prepared TFDS datasets from TFRecord to ArrayRecord, without apache-beam.

    python -m big_vision_relu.data.convert --datasets=imagenet2012,cifar100:3.0.2 \
        --data_dir=gs://BUCKET/tensorflow_datasets [--out_data_dir=DIR] [--workers=32]

The input pipeline reads records by number (`input_pipeline`), which TFRecord files cannot give;
datasets a big_vision user already has (built by `tfds build`, TFDS's default format) are
TFRecord. `tfds convert_format` converts them, but TFDS's converter imports apache-beam even
for its local mode. This does the same with TFDS's own file adapters, shard by shard:

- DATASET is `name[/config][:version]` (default: the newest version prepared in the data dir),
  read from `<data_dir>/name[/config]/version` (its `dataset_info.json` lists every split's
  shards and their record counts).
- Each TFRecord shard is read in order and written as one ArrayRecord shard of the same name
  (`...-train.array_record-00003-of-00016`) and record order, so record i of a split is the
  same example in both formats. `--workers` shards at once (threads: the reads and writes are
  I/O, in C++). A shard is written under a temporary name and renamed when complete, then its
  record count is checked against the TFRecord shard's (as read, and as `dataset_info.json`
  lists it); a mismatch stops the conversion before `dataset_info.json` changes.
- Progress (shards and records done, records/s, ETA) is logged every `--progress_seconds`.
- Re-running skips shards already converted whose record count checks out, so an interrupted
  conversion resumes.
- When every shard of every split is there and checked: in place (no `--out_data_dir`),
  `array_record` is added to `dataset_info.json`'s alternative file formats (TFRecord stays
  the main one, its files untouched); into `--out_data_dir`, the version dir there gets the
  ArrayRecord shards, every other file of the source version dir (features.json, label files,
  ...) and a `dataset_info.json` whose file format is `array_record`. Either way TFDS then
  offers the dataset as ArrayRecord (`builder.info.available_file_formats()`), which is what
  `datasets.raw_record_source` asks for.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import threading
import time
from collections.abc import Sequence

from absl import app, flags, logging
from etils import epath
import tensorflow_datasets as tfds

import big_vision_relu  # noqa: F401  (quiets TensorFlow)

_FORMATS = tfds.core.file_adapters.FileFormat
_TFRECORD, _ARRAY_RECORD = _FORMATS.TFRECORD, _FORMATS.ARRAY_RECORD
_ADAPTERS = tfds.core.file_adapters.ADAPTER_FOR_FORMAT
_INFO = tfds.core.dataset_info
_NAME = re.compile(r"([a-z][a-z0-9_]*)(/[A-Za-z0-9_.-]+)?(?::(\d+\.\d+\.\d+))?")
_VERSION = re.compile(r"\d+\.\d+\.\d+")


class ConversionError(ValueError):
  """The dataset cannot be converted, or a converted shard does not check out."""


@dataclasses.dataclass(frozen=True)
class Shard:
  """One TFRecord shard and the ArrayRecord shard it becomes."""
  dataset: str  # name/config/version, for messages
  split: str
  source: epath.Path
  target: epath.Path
  num_records: int  # as dataset_info.json lists it


def version_dir(dataset: str, data_dir: epath.PathLike) -> epath.Path:
  """`<data_dir>/name[/config]/version` of `dataset` (`name[/config][:version]`); without a
  version, the newest one there that has a dataset_info.json. Raises ConversionError."""
  match = _NAME.fullmatch(dataset)
  if not match:
    raise ConversionError(f"{dataset!r} is not a TFDS dataset name (name[/config][:version], "
                          "e.g. imagenet2012:5.1.0 or imagenet_v2/matched-frequency)")
  name, config, version = match.groups()
  base = epath.Path(data_dir) / name / (config or "/").strip("/")
  if version is None:
    versions = sorted((tuple(map(int, p.name.split("."))) for p in _children(base)
                       if _VERSION.fullmatch(p.name)
                       and _INFO.dataset_info_path(p).exists()), reverse=True)
    if not versions:
      raise ConversionError(f"No prepared version of {dataset} in {base} (no "
                            "<version>/dataset_info.json there): check --data_dir.")
    version = ".".join(map(str, versions[0]))
  path = base / version
  if not _INFO.dataset_info_path(path).exists():
    raise ConversionError(f"{path} holds no dataset_info.json: {dataset} is not prepared in "
                          f"{data_dir}.")
  return path


def _children(path: epath.Path) -> list[epath.Path]:
  return list(path.iterdir()) if path.exists() else []


def plan(source_dir: epath.Path, target_dir: epath.Path) -> list[Shard]:
  """Every shard of every split of the dataset in `source_dir` (a version dir), to convert
  into `target_dir` (the same, or another version dir). Raises ConversionError if the dataset
  is not TFRecord."""
  info = _INFO.read_from_json(_INFO.dataset_info_path(source_dir))
  file_format = _FORMATS(info.file_format) if info.file_format else _TFRECORD  # older TFDS
  full_name = "/".join(source_dir.parts[-3 if info.config_name else -2:])
  if file_format != _TFRECORD:
    raise ConversionError(f"{full_name} in {source_dir} is stored as {file_format.value}; this "
                          "converts TFRecord datasets only.")
  sources = _INFO.get_split_dict_from_proto(info, source_dir, _TFRECORD)
  targets = _INFO.get_split_dict_from_proto(info, target_dir, _ARRAY_RECORD)
  shards = []
  for split, split_info in sources.items():
    lengths = list(split_info.shard_lengths)
    for index, (length, source, target) in enumerate(zip(
        lengths, split_info.filename_template.sharded_filepaths(len(lengths)),
        targets[split].filename_template.sharded_filepaths(len(lengths)))):
      del index
      shards.append(Shard(full_name, split, source, target, int(length)))
  return shards


def already_converted(shard: Shard) -> bool:
  """Whether `shard.target` exists with the shard's record count (a finished earlier run)."""
  if not shard.target.exists():
    return False
  return _ADAPTERS[_ARRAY_RECORD].num_examples(shard.target) == shard.num_records


def convert_shard(shard: Shard, done: list[int], slot: int) -> None:
  """Reads `shard.source` (TFRecord) in order and writes `shard.target` (ArrayRecord);
  `done[slot]` counts the records written. Raises ConversionError on any count mismatch."""
  temporary = shard.target.parent / f".{shard.target.name}.incomplete"

  def records():
    for i, record in enumerate(
        _ADAPTERS[_TFRECORD].make_tf_data(shard.source).as_numpy_iterator()):
      done[slot] = i + 1
      yield i, record

  _ADAPTERS[_ARRAY_RECORD].write_examples(temporary, records())
  read = done[slot]
  written = _ADAPTERS[_ARRAY_RECORD].num_examples(temporary)
  if not read == written == shard.num_records:
    temporary.unlink()
    raise ConversionError(
        f"{shard.dataset} {shard.split}: {shard.source} has {read} records, dataset_info.json "
        f"lists {shard.num_records}, {written} were written; the dataset's files and its "
        "dataset_info.json disagree: rebuild it.")
  temporary.rename(shard.target)


def finish(source_dir: epath.Path, target_dir: epath.Path) -> None:
  """Makes TFDS see the ArrayRecord shards: see the module docstring."""
  info = _INFO.read_from_json(_INFO.dataset_info_path(source_dir))
  if target_dir == source_dir:
    if _ARRAY_RECORD.value not in info.alternative_file_formats:
      info.alternative_file_formats.append(_ARRAY_RECORD.value)
  else:
    for path in source_dir.iterdir():
      # Everything but the TFRecord shards, e.g. features.json and label files.
      if path.is_file() and ".tfrecord-" not in path.name and path.name != (
          _INFO.dataset_info_path(source_dir).name):
        path.copy(target_dir / path.name, overwrite=True)
    info.file_format = _ARRAY_RECORD.value
    del info.alternative_file_formats[:]
  _INFO.write_dataset_info_proto(info, target_dir)


def convert(datasets: Sequence[str], data_dir: epath.PathLike,
            out_data_dir: epath.PathLike | None = None, *, workers: int = 16,
            progress_seconds: float = 60.0) -> list[epath.Path]:
  """Converts `datasets` (see the module docstring); returns their ArrayRecord version dirs."""
  dirs = []
  for dataset in datasets:
    source = version_dir(dataset, data_dir)
    if out_data_dir is None:
      target = source
    else:
      target = epath.Path(out_data_dir).joinpath(
          *source.parts[len(epath.Path(data_dir).parts):])
      if target == source:
        raise ConversionError(f"--out_data_dir {out_data_dir} is --data_dir: leave it out to "
                              "convert in place.")
    dirs.append((dataset, source, target))
  shards = [(shard, target) for dataset, source, target in dirs
            for shard in plan(source, target)]
  for _, _, target in dirs:
    target.mkdir(parents=True, exist_ok=True)
  todo = [shard for shard, _ in shards if not already_converted(shard)]
  total = sum(shard.num_records for shard in todo)
  logging.info("Converting %d of %d shards (%d records; the others were converted before) of %s "
               "with %d workers.", len(todo), len(shards), total, ", ".join(datasets), workers)
  done = [0] * len(todo)
  finished = threading.Event()
  start = time.monotonic()

  def report() -> None:
    while not finished.wait(progress_seconds):
      logging.info("%s", progress_line(sum(done), total, sum(d == s.num_records and d > 0
                                                            for d, s in zip(done, todo)),
                                       len(todo), time.monotonic() - start))

  reporter = threading.Thread(target=report, daemon=True)
  reporter.start()
  try:
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
      futures = [pool.submit(convert_shard, shard, done, i) for i, shard in enumerate(todo)]
      try:
        for future in futures:
          future.result()
      except BaseException:  # the first failure: no new shard starts, running ones finish
        pool.shutdown(cancel_futures=True)
        raise
  finally:
    finished.set()
    reporter.join()
  logging.info("%s", progress_line(sum(done), total, len(todo), len(todo),
                                   time.monotonic() - start))
  for dataset, source, target in dirs:
    missing = [s.target for s, t in shards if t == target and not s.target.exists()]
    if missing:  # only if a shard vanished since: every one was written or checked above
      raise ConversionError(f"{dataset}: shards missing in {target}: {missing[:3]}")
    finish(source, target)
  return [target for _, _, target in dirs]


def progress_line(records: int, total: int, shards: int, num_shards: int,
                  elapsed: float) -> str:
  """`<shards> of <n> shards, <records> of <total> records (<percent>), <rate> records/s,
  ETA <hours>`."""
  rate = records / max(elapsed, 1e-9)
  eta = (total - records) / rate if rate else float("inf")
  return (f"progress: {shards:,} of {num_shards:,} shards, {records:,} of {total:,} records "
          f"({100 * records / max(total, 1):.1f}%), {rate:,.0f} records/s, ETA {eta / 3600:.1f} h")


def command(dataset: str, data_dir: str) -> str:
  """The command that converts `dataset` in `data_dir` in place (for error messages)."""
  return f"python -m big_vision_relu.data.convert --datasets={dataset} --data_dir={data_dir}"


def main(argv: list[str]) -> None:
  del argv
  values = flags.FLAGS
  if not values.datasets:
    raise app.UsageError("--datasets is required (e.g. --datasets=imagenet2012,cifar100).")
  data_dir = values.data_dir or tfds.core.constants.get_default_data_dir()
  try:
    targets = convert(values.datasets, data_dir, values.out_data_dir, workers=values.workers,
                      progress_seconds=values.progress_seconds)
  except ConversionError as error:
    raise SystemExit(f"error: {error}") from None
  for dataset, target in zip(values.datasets, targets):
    print(f"{dataset}: ArrayRecord in {target}")


if __name__ == "__main__":
  # Defined here, not at import: datasets.py imports this module for `command`, beside
  # prepare.py's flags of the same names.
  flags.DEFINE_list("datasets", None, "TFDS datasets to convert: name[/config][:version], "
                    "comma-separated.")
  flags.DEFINE_string("data_dir", None, "TFDS data dir holding them (default: TFDS_DATA_DIR or "
                      "~/tensorflow_datasets).")
  flags.DEFINE_string("out_data_dir", None, "Write the ArrayRecord datasets into this data dir "
                      "instead of beside the TFRecord files.")
  flags.DEFINE_integer("workers", 16, "Shards converted at once.", lower_bound=1)
  flags.DEFINE_float("progress_seconds", 60.0, "How often to log progress.", lower_bound=0.01)
  app.run(main)
