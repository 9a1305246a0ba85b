"""data/convert.py: a real TFDS dataset (a tiny builder defined here) built as TFRecord, 4 shards
per split, converted to ArrayRecord in place and into another data dir, read back record by
record and through the training pipeline, against the same dataset built as ArrayRecord."""
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from big_vision_relu.data import builders, convert, datasets, input_pipeline

from conftest import ROOT

NAME = "convert_tiny"
PP = 'decode(channels=1)|value_range(-1, 1)|onehot(10)|keep("image", "labels")'


class ConvertTiny(tfds.core.GeneratorBasedBuilder):
  """260 seeded 8x8 images in two splits: a TFDS dataset in whichever format it is built."""
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(8, 8, 1)),
        "label": tfds.features.ClassLabel(num_classes=10)}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(0, 200), "test": self._generate_examples(1, 60)}

  def _generate_examples(self, seed, n):
    rng = np.random.default_rng(seed)
    for i in range(n):
      yield i, {"image": rng.integers(0, 256, (8, 8, 1), np.uint8), "label": i % 10}


def _build(data_dir, file_format):
  builder = tfds.builder(NAME, data_dir=str(data_dir), file_format=file_format)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      try_download_gcs=False, num_shards=4))
  return builder


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """The dataset as TFRecord (the source) and as ArrayRecord (the reference), 4 shards a split."""
  tfds.disable_progress_bar()
  root = tmp_path_factory.mktemp("convert")
  tfrecord, reference = _build(root / "tfrecord", "tfrecord"), _build(root / "reference",
                                                                      builders.DEFAULT_FILE_FORMAT)
  return root, tfrecord, reference


def _tfrecord_records(builder, split) -> list[bytes]:
  """The split's records read straight from its TFRecord shards, in shard order."""
  return list(tfds.as_numpy(tf.data.TFRecordDataset(
      [str(p) for p in builder.info.splits[split].filepaths])))


def _array_records(data_dir, split) -> list[bytes]:
  source = datasets.raw_record_source(datasets.get_builder(NAME, str(data_dir)), split)
  return list(source.__getitems__(list(range(len(source)))))


def _batches(data_dir, steps=3):
  data = dict(name=NAME, split="train", data_dir=str(data_dir))
  batches = input_pipeline.training_batches(data, PP, 32, seed=7,
                                            process_index=0, process_count=1, prefetch=1)
  try:
    return [next(batches) for _ in range(steps)]
  finally:
    batches.close()


def test_tfrecord_is_refused_with_the_command_that_converts_it_in_place(built, tmp_path):
  """raw_record_source names the command; running exactly that command (a real process, with
  progress lines) converts in place: TFRecord files untouched, ArrayRecord beside them, every
  record equal, and the training pipeline's batches those of a native ArrayRecord build."""
  root, tfrecord, reference = built
  data_dir = tmp_path / "data"
  (data_dir / NAME).mkdir(parents=True)
  source_dir = data_dir / NAME / tfrecord.info.version.__str__()
  subprocess.run(["cp", "-r", str(tfrecord.data_dir), str(source_dir)], check=True)
  builder = tfds.builder(NAME, data_dir=str(data_dir))
  with pytest.raises(ValueError) as error:
    datasets.raw_record_source(builder, "train")
  command = convert.command(f"{NAME}:{builder.info.version}", str(data_dir))
  assert command in str(error.value) and "tfds convert_format" not in str(error.value)
  tfrecord_files = {p.name: p.read_bytes() for p in source_dir.iterdir()}

  done = subprocess.run([sys.executable, *command.split()[1:], "--workers=3",
                         "--progress_seconds=0.01"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"{NAME}:{builder.info.version}: ArrayRecord in {source_dir}" in done.stdout
  assert "Converting 8 of 8 shards (260 records" in done.stderr  # 2 splits x 4 shards
  assert "progress: 8 of 8 shards, 260 of 260 records (100.0%)" in done.stderr
  assert "records/s, ETA" in done.stderr
  for name, content in tfrecord_files.items():
    if name != "dataset_info.json":
      assert (source_dir / name).read_bytes() == content, name
  info = json.loads((source_dir / "dataset_info.json").read_text())
  assert info["fileFormat"] == "tfrecord" and info["alternativeFileFormats"] == ["array_record"]
  assert len(list(source_dir.glob("*.array_record-*"))) == 8

  for split in ("train", "test"):
    assert _array_records(data_dir, split) == _tfrecord_records(tfrecord, split), split
  converted, native = _batches(data_dir), _batches(root / "reference")
  for a, b in zip(converted, native):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])

  # Re-running converts nothing: every shard is there with its record count.
  mtimes = {p: p.stat().st_mtime_ns for p in source_dir.glob("*.array_record-*")}
  convert.convert([NAME], str(data_dir))
  assert {p: p.stat().st_mtime_ns for p in source_dir.glob("*.array_record-*")} == mtimes


def test_into_another_data_dir(built, tmp_path):
  """--out_data_dir: a version dir of ArrayRecord shards, the metadata files, and a
  dataset_info.json whose file format is array_record; the source is not touched."""
  root, tfrecord, _ = built
  src_root = root / "tfrecord"
  before = {p: p.stat().st_mtime_ns for p in (src_root / NAME).rglob("*")}
  [target] = convert.convert([NAME], str(src_root), str(tmp_path / "out"), workers=2)
  assert target == tmp_path / "out" / NAME / str(tfrecord.info.version)
  assert {p: p.stat().st_mtime_ns for p in (src_root / NAME).rglob("*")} == before
  assert not list(target.glob("*.tfrecord-*")) and not list(target.glob(".*incomplete"))
  assert (target / "features.json").exists()
  assert json.loads((target / "dataset_info.json").read_text())["fileFormat"] == "array_record"
  out = datasets.get_builder(NAME, str(tmp_path / "out"))
  assert {s: out.info.splits[s].shard_lengths for s in out.info.splits} == {
      s: tfrecord.info.splits[s].shard_lengths for s in tfrecord.info.splits}
  for split in tfrecord.info.splits:
    assert _array_records(tmp_path / "out", split) == _tfrecord_records(tfrecord, split), split


def test_a_count_mismatch_stops_before_dataset_info_changes(built, tmp_path):
  """A dataset_info.json whose shard length is not the file's: the conversion fails naming
  the shard, leaves no ArrayRecord shard for it and does not touch dataset_info.json."""
  root, tfrecord, _ = built
  data_dir = tmp_path / "data"
  subprocess.run(["cp", "-r", str(root / "tfrecord"), str(data_dir)], check=True)
  version_dir = data_dir / NAME / str(tfrecord.info.version)
  info_path = version_dir / "dataset_info.json"
  info = json.loads(info_path.read_text())
  train = next(s for s in info["splits"] if s["name"] == "train")
  train["shardLengths"][2] = str(int(train["shardLengths"][2]) + 1)
  info_path.write_text(json.dumps(info))
  with pytest.raises(convert.ConversionError,
                     match=r"train: .*-train\.tfrecord-00002-of-00004 has"):
    convert.convert([NAME], str(data_dir), workers=1)
  assert json.loads(info_path.read_text()) == info
  assert not list(version_dir.glob("*-train.array_record-00002-of-00004"))
  assert not list(version_dir.glob(".*incomplete"))


def test_names_and_formats_are_checked(built, tmp_path):
  root, _, _ = built
  for bad, says in (("Tiny", "not a TFDS dataset name"), (f"{NAME}:9.9.9", "no dataset_info"),
                    ("cifar100", "No prepared version")):
    with pytest.raises(convert.ConversionError, match=says):
      convert.convert([bad], str(root / "tfrecord"))
  with pytest.raises(convert.ConversionError, match="stored as array_record"):
    convert.convert([NAME], str(root / "reference"))
  with pytest.raises(convert.ConversionError, match="is --data_dir"):
    convert.convert([NAME], str(root / "tfrecord"), str(root / "tfrecord"))
