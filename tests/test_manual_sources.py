"""Datasets built from files fetched by hand (cars196, caltech_birds2011): the checksums agree
with TFDS's own, the verifier checks real files, and every error says which file and where to
get it."""
import hashlib
import pathlib
import subprocess
import sys
import types

import pytest
import tensorflow_datasets as tfds

from big_vision_relu.data import datasets, manual_sources
from conftest import ROOT


def tfds_checksums(name: str) -> dict[str, tuple[int, str]]:
  """{file name: (size, sha256)} from the installed TFDS's url_checksums/<name>.txt."""
  path = pathlib.Path(tfds.__file__).parent / "url_checksums" / f"{name}.txt"
  rows = [line.split("\t") for line in path.read_text().splitlines() if line.strip()]
  return {filename: (int(size), sha256) for _, size, sha256, filename in rows}


@pytest.mark.parametrize("name", sorted(manual_sources.SOURCES))
def test_registered_files_are_the_ones_tfds_expects(name):
  expected = tfds_checksums(name)
  files = manual_sources.SOURCES[name].files
  assert {f.name: (f.size, f.sha256) for f in files} == {
      f.name: expected[f.name] for f in files}
  # TFDS finds a manual file by the file name its checksums list: every file it downloads.
  assert {f.name for f in files} == set(expected)


def fixture_files(directory: pathlib.Path) -> list[manual_sources.SourceFile]:
  """Two real files and their SourceFiles (size and sha256 computed here)."""
  directory.mkdir(exist_ok=True)
  files = []
  for name, data in (("a.tgz", b"first file\n" * 100), ("b.mat", bytes(range(256)) * 3)):
    (directory / name).write_bytes(data)
    files.append(manual_sources.SourceFile(name, len(data), hashlib.sha256(data).hexdigest(),
                                           f"https://example.org/{name}"))
  return files


def test_verify_accepts_the_right_files(tmp_path):
  files = fixture_files(tmp_path)
  manual_sources.verify("cars196", str(tmp_path), files)
  manual_sources.verify("cars196", f"{tmp_path}/", files)


def test_verify_names_every_missing_or_short_file_and_where_to_get_it(tmp_path):
  files = fixture_files(tmp_path)
  (tmp_path / "a.tgz").unlink()
  (tmp_path / "b.mat").write_bytes(b"short")
  with pytest.raises(manual_sources.ManualSourceError) as error:
    manual_sources.verify("cars196", str(tmp_path), files)
  message = str(error.value)
  assert f"- {tmp_path}/a.tgz is missing; get a.tgz from https://example.org/a.tgz" in message
  assert (f"- {tmp_path}/b.mat has 5 bytes, expected {files[1].size}; get b.mat from "
          "https://example.org/b.mat") in message


def test_verify_checks_the_contents(tmp_path):
  files = fixture_files(tmp_path)
  data = bytearray((tmp_path / "b.mat").read_bytes())
  data[100] ^= 1  # same size, one bit flipped
  (tmp_path / "b.mat").write_bytes(bytes(data))
  with pytest.raises(manual_sources.ManualSourceError) as error:
    manual_sources.verify("cars196", str(tmp_path), files)
  message = str(error.value)
  assert (f"{tmp_path}/b.mat has sha256 {hashlib.sha256(data).hexdigest()}, expected "
          f"{files[1].sha256}") in message
  assert "a.tgz" not in message


def test_build_verifies_before_writing_anything(tmp_path):
  data_dir, manual_dir = tmp_path / "data", tmp_path / "manual"
  data_dir.mkdir()
  manual_dir.mkdir()
  (manual_dir / "cars_train.tgz").write_bytes(b"not the archive")
  with pytest.raises(manual_sources.ManualSourceError) as error:
    manual_sources.build("cars196", str(data_dir), str(manual_dir))
  message = str(error.value)
  for f in manual_sources.SOURCES["cars196"].files:
    assert f"get {f.name} from {f.where}" in message
  assert f"{manual_dir}/cars_train.tgz has 15 bytes, expected 979269282" in message
  assert list(data_dir.iterdir()) == []


def run_prepare(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "big_vision_relu.data.prepare", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False)


def test_prepare_command_explains_and_checks(tmp_path):
  result = run_prepare("--datasets=cars196", f"--data_dir={tmp_path}")
  assert result.returncode != 0
  assert "cars196 needs --manual_dir" in result.stderr
  assert "cars_test_annos_withlabels.mat  185758 bytes  sha256 790f75be" in result.stderr
  assert (f"Then run: python -m big_vision_relu.data.prepare --datasets=cars196 "
          f"--manual_dir=DIR_WITH_THE_FILES --data_dir={tmp_path}") in result.stderr

  manual = tmp_path / "manual"
  manual.mkdir()
  result = run_prepare("--datasets=caltech_birds2011", f"--manual_dir={manual}",
                       f"--data_dir={tmp_path / 'data'}")
  assert result.returncode == 1
  assert f"Cannot build caltech_birds2011: caltech_birds2011: the manual download in {manual}" \
      in result.stderr
  assert (f"{manual}/CUB_200_2011.tgz is missing; get CUB_200_2011.tgz from "
          "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1"
          ) in result.stderr
  assert not (tmp_path / "data").exists()


def test_unprepared_message_names_the_manual_steps(tmp_path):
  data_dir = str(tmp_path)
  with pytest.raises(datasets.DatasetNotPreparedError) as error:
    datasets.check_prepared([("cars196", data_dir), ("caltech_birds2011", data_dir)])
  message = str(error.value)
  for name in ("cars196", "caltech_birds2011"):
    assert (f"then run: python -m big_vision_relu.data.prepare --datasets={name} "
            f"--manual_dir=DIR_WITH_THE_FILES --data_dir={data_dir}") in message
    assert (f"{name.upper()}_MANUAL_DIR=gs://BUCKET/DIR_WITH_THE_FILES bash launch/tpu/data.sh "
            f"{name}") in message
    for f in manual_sources.SOURCES[name].files:
      assert f"{f.name}  {f.size} bytes  sha256 {f.sha256}" in message
  assert "tensorflow/datasets#5053" in message


def test_download_without_manual_files_only_where_tfds_download_still_works(tmp_path,
                                                                            monkeypatch):
  """`prepare --download`: caltech_birds2011 without --manual_dir goes to TFDS's own download
  (CaltechDATA works); cars196 (download dead) still needs its files; with --manual_dir both
  are built from the checked files. The network steps are recorded, not run (offline here)."""
  from absl import app, flags

  from big_vision_relu.data import prepare
  calls = []

  def recorder(kind):
    def record(name, *args):
      calls.append((kind, name))
      return types.SimpleNamespace(data_dir=str(tmp_path), info=types.SimpleNamespace(splits={}))
    return record
  monkeypatch.setattr(prepare, "download", recorder("download"))
  monkeypatch.setattr(manual_sources, "build", recorder("manual"))

  def main(*args):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["prepare", f"--data_dir={tmp_path}", *args])
    prepare.main([])

  try:
    main("--download", "--datasets=caltech_birds2011")
    assert calls == [("download", "caltech_birds2011")]
    with pytest.raises(app.UsageError, match="cars196 needs --manual_dir"):
      main("--download", "--datasets=cars196")
    calls.clear()
    main("--download", "--datasets=cars196", f"--manual_dir={tmp_path}")
    main("--download", "--datasets=caltech_birds2011", f"--manual_dir={tmp_path}")
    assert calls == [("manual", "cars196"), ("manual", "caltech_birds2011")]
    with pytest.raises(app.UsageError, match="caltech_birds2011 needs --manual_dir"):
      main("--datasets=caltech_birds2011")  # without --download: only the hand-fetched files
  finally:
    flags.FLAGS.unparse_flags()
