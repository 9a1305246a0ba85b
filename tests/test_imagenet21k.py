"""imagenet21k builder: built offline from fabricated per-synset tars with a tiny class set."""
import hashlib
import io
import os
import tarfile
import time

import numpy as np
import PIL.Image
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from big_vision_relu.data import datasets, imagenet21k, label_maps

import imagenet21k_fixture as fixture
from conftest import block_network

# Real wnids, deliberately not in sorted order: labels are positions in this list.
_ALL_WNIDS = label_maps.imagenet21k_wnids()
WNIDS = (_ALL_WNIDS[21842], _ALL_WNIDS[7], _ALL_WNIDS[1000], _ALL_WNIDS[0])
ABSENT = _ALL_WNIDS[500]  # A class with no tar in the manual dirs.
OUTSIDE = _ALL_WNIDS[600]  # A synset tar that is not in the class set.
CMYK = f"{WNIDS[1]}/{WNIDS[1]}_77.JPEG"
PNG = f"{WNIDS[2]}/{WNIDS[2]}_88.JPEG"  # A PNG with a .JPEG name.
GRAY = f"{WNIDS[3]}/{WNIDS[3]}_99.JPEG"
REENCODED = (CMYK, PNG)


def _encode(image: PIL.Image.Image, fmt: str) -> bytes:
  out = io.BytesIO()
  image.save(out, format=fmt)
  return out.getvalue()


def _make_files() -> dict[str, bytes]:
  """{file_name: bytes}: 3 small noise RGB JPEGs per class, plus CMYK, PNG and gray files."""
  rng = np.random.default_rng(0)
  files = {}
  for wnid in WNIDS:
    for i in range(3):
      pixels = rng.integers(0, 256, (8 + i, 10 + i, 3), dtype=np.uint8)
      files[f"{wnid}/{wnid}_{i + 1}.JPEG"] = _encode(PIL.Image.fromarray(pixels), "JPEG")
  files[CMYK] = _encode(PIL.Image.new("CMYK", (16, 12), (0, 200, 255, 30)), "JPEG")
  files[PNG] = _encode(PIL.Image.new("RGB", (12, 16), (30, 160, 220)), "PNG")
  files[GRAY] = _encode(PIL.Image.fromarray(rng.integers(0, 256, (9, 9), dtype=np.uint8)),
                        "JPEG")
  return files


def _write_manual_dir(path, files: dict[str, bytes], wnids, *, variant: bool):
  """One tar per wnid. variant: tars and members in reverse order, other mtimes, members
  under a directory entry, plus a tar outside the class set and a non-tar file."""
  path.mkdir()
  mtime = 1_700_000_000 if variant else 1_300_000_000
  for wnid in (reversed(wnids) if variant else wnids):
    names = [n for n in files if n.startswith(wnid + "/")]
    with tarfile.open(path / f"{wnid}.tar", "w") as tar:
      if variant:
        fixture.add_member(tar, wnid, None, mtime)
      for name in (reversed(names) if variant else names):
        member = name if variant else name.split("/")[1]  # '<wnid>/<file>' or '<file>'.
        fixture.add_member(tar, member, files[name], mtime)
    os.utime(path / f"{wnid}.tar", (mtime, mtime))
  if variant:
    with tarfile.open(path / f"{OUTSIDE}.tar", "w") as tar:
      fixture.add_member(tar, f"{OUTSIDE}_1.JPEG", files[GRAY], mtime)
    (path / "README.txt").write_text("not a synset tar")
  return path


def _config(name: str = "tiny", wnids=WNIDS, **kwargs) -> imagenet21k.Imagenet21kConfig:
  return imagenet21k.Imagenet21kConfig(name=name, wnids=tuple(wnids), **kwargs)


def _records(data_dir, name: str = "imagenet21k/tiny") -> list[bytes]:
  return fixture.records(data_dir, name)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """Two builds of the same images, from manual dirs made differently (network blocked)."""
  tfds.disable_progress_bar()
  root = tmp_path_factory.mktemp("i21k")
  files = _make_files()
  manual_a = _write_manual_dir(root / "manual_a", files, WNIDS, variant=False)
  manual_b = _write_manual_dir(root / "manual_b", files, WNIDS, variant=True)
  with pytest.MonkeyPatch.context() as mp:
    attempts = block_network(mp)
    fixture.build(manual_a, root / "data_a", _config())
    fixture.build(manual_b, root / "data_b", _config())
  assert not attempts, f"the build tried the network: {attempts}"
  return {"files": files, "root": root, "manual_a": manual_a,
          "records_a": _records(root / "data_a"), "records_b": _records(root / "data_b")}


def test_examples_labels_and_kept_jpeg_bytes(built):
  files = built["files"]
  examples = [fixture.parse(r) for r in built["records_a"]]
  assert sorted(name for _, _, name in examples) == sorted(files)
  builder = datasets.get_builder("imagenet21k/tiny", str(built["root"] / "data_a"))
  assert builder.info.file_format == tfds.core.file_adapters.FileFormat.ARRAY_RECORD
  assert builder.info.splits["full"].num_examples == len(files) == 15
  assert builder.info.features["label"].names == list(WNIDS)
  for image, label, name in examples:
    assert label == WNIDS.index(name.split("/")[0]), name
    if name not in REENCODED:  # Normal and grayscale JPEGs: the original bytes.
      assert image == files[name], name
  gray = {n: i for i, _, n in examples}[GRAY]
  assert tf.io.decode_jpeg(gray, channels=3).shape == (9, 9, 3)


def test_cmyk_and_png_are_reencoded_as_rgb_jpeg(built):
  stored = {name: image for image, _, name in map(fixture.parse, built["records_a"])}
  for name in REENCODED:
    with PIL.Image.open(io.BytesIO(stored[name])) as image:
      assert (image.format, image.mode) == ("JPEG", "RGB"), name
    decoded = tf.io.decode_jpeg(stored[name], channels=0).numpy()  # channels as stored
    with PIL.Image.open(io.BytesIO(built["files"][name])) as original:
      expected = np.asarray(original.convert("RGB"))
    assert decoded.shape == expected.shape and decoded.shape[-1] == 3, name
    np.testing.assert_allclose(decoded, expected, atol=6, err_msg=name)


def test_order_depends_only_on_file_names(built):
  # Tars and members written in other orders, with other mtimes and layout: same records.
  assert built["records_a"] == built["records_b"]
  names = [fixture.parse(r)[2] for r in built["records_a"]]
  # The documented order: by md5(split name + file name), TFDS's key hash.
  assert names == sorted(names, key=lambda n: hashlib.md5(b"full" + n.encode()).hexdigest())
  assert names != sorted(names)


def test_slices_through_num_examples(built):
  data = {"name": "imagenet21k/tiny", "data_dir": str(built["root"] / "data_a")}
  assert datasets.num_examples({**data, "split": "full[:4]"}) == 4
  assert datasets.num_examples({**data, "split": "full[4:8]"}) == 4
  assert datasets.num_examples({**data, "split": "full[8:]"}) == 7
  assert datasets.num_examples({**data, "split": "full[:4]+full[8:]"}) == 11


def test_missing_classes_raise_unless_allowed(built, tmp_path):
  wnids = WNIDS + (ABSENT,)
  with pytest.raises(ValueError, match=rf"1 of the 5 classes .* e\.g\. {ABSENT}\. .*fall 2011"):
    fixture.build(built["manual_a"], tmp_path / "strict", _config("strict", wnids))
  fixture.build(built["manual_a"], tmp_path / "lenient",
         _config("lenient", wnids, may_be_missing=frozenset({ABSENT})))
  builder = datasets.get_builder("imagenet21k/lenient", str(tmp_path / "lenient"))
  assert builder.info.features["label"].num_classes == 5
  labels = [fixture.parse(r)[1] for r in _records(tmp_path / "lenient", "imagenet21k/lenient")]
  assert len(labels) == 15 and 4 not in labels


@pytest.mark.parametrize("content, match", [
    (None, "holds no images"),
    (b"not an image at all", "PIL cannot decode"),
])
def test_empty_tar_or_undecodable_file_raise(tmp_path, content, match):
  manual = tmp_path / "manual"
  manual.mkdir()
  for wnid in WNIDS:
    with tarfile.open(manual / f"{wnid}.tar", "w") as tar:
      if content is not None or wnid != WNIDS[0]:
        fixture.add_member(tar, f"{wnid}_1.JPEG",
                           content or _encode(PIL.Image.new("RGB", (4, 4)), "JPEG"))
  with pytest.raises(ValueError, match=match):
    fixture.build(manual, tmp_path / "data", _config())


def test_config_rejects_bad_class_lists():
  with pytest.raises(ValueError, match="repeated"):
    _config("dup", (WNIDS[0], WNIDS[0]))
  with pytest.raises(ValueError, match="not wordnet ids"):
    _config("bad", ("dog",))
  with pytest.raises(ValueError, match="outside wnids"):
    _config("extra", WNIDS, may_be_missing=frozenset({ABSENT}))
  with pytest.raises(ValueError, match="not both or neither"):
    _config("both", WNIDS, num_classes=4)
  with pytest.raises(ValueError, match="not both or neither"):
    imagenet21k.Imagenet21kConfig(name="neither")


def test_default_config_is_googles_21843_classes(tmp_path):
  builder = tfds.builder("imagenet21k", data_dir=str(tmp_path))
  assert builder.builder_config is imagenet21k.FALL2011
  assert tfds.builder("imagenet21k/fall2011", data_dir=str(tmp_path)).builder_config is (
      imagenet21k.FALL2011)
  assert builder.info.features["label"].names == label_maps.imagenet21k_wnids()
  assert imagenet21k.FALL2011.may_be_missing <= set(label_maps.imagenet21k_wnids())


def test_get_builder_fails_fast_with_the_manual_download_instructions(tmp_path, monkeypatch):
  attempts = block_network(monkeypatch)
  start = time.monotonic()
  with pytest.raises(datasets.DatasetNotPreparedError) as error:
    datasets.get_builder("imagenet21k", str(tmp_path))
  assert time.monotonic() - start < 5
  message = str(error.value)
  assert str(tmp_path) in message
  assert imagenet21k.MANUAL_DOWNLOAD_INSTRUCTIONS.strip() in message
  assert not attempts


def test_progress_line_rate_and_eta():
  """Images and tars done, images/s and the ETA from the share of tars done, at most every
  PROGRESS_SECONDS and always after the last tar."""
  now = [100.0]
  progress = imagenet21k.Progress("imagenet21k/winter2021", num_tars=4, clock=lambda: now[0])
  now[0] += 30
  assert progress.update(300) is None  # before PROGRESS_SECONDS
  now[0] += 30
  assert progress.update(900) == ("imagenet21k/winter2021 progress: 1,200 images, 2 of 4 tars "
                                  "(50.0%), 20 images/s, ETA 0.0 h")
  now[0] += 7200 - 60
  assert progress.update(100) == ("imagenet21k/winter2021 progress: 1,300 images, 3 of 4 tars "
                                  "(75.0%), 0 images/s, ETA 0.7 h")  # 2 h for 3 of 4: 40 min
  now[0] += 1
  assert progress.update(10).startswith("imagenet21k/winter2021 progress: 1,310 images, 4 of 4")


def test_command_line_needs_the_release_and_builds_it_with_progress(tmp_path, monkeypatch,
                                                                   caplog, capsys):
  """`--release` is required (no silent fall 2011); winter2021 (its class count set to this
  fixture's) builds from the tars and logs progress lines; TFDS's bar is back on afterwards."""
  with pytest.raises(SystemExit):
    imagenet21k.main(["--manual_dir", str(tmp_path)])
  assert "--release" in capsys.readouterr().err
  wnids = sorted(WNIDS[:2])
  rng = np.random.default_rng(3)
  manual = fixture.write_synset_tars(tmp_path / "manual", {
      f"{w}/{w}_{i}.JPEG": fixture.photo_jpeg(rng, 32, 40) for w in wnids for i in range(3)})
  monkeypatch.setattr(imagenet21k.WINTER2021, "num_classes", 2)
  monkeypatch.setattr(imagenet21k, "PROGRESS_SECONDS", 0.0)
  caplog.set_level("INFO")
  tfds.enable_progress_bar()
  imagenet21k.main(["--release=winter2021", f"--manual_dir={manual}",
                    f"--data_dir={tmp_path / 'data'}"])
  assert "imagenet21k/winter2021/1.0.0" in capsys.readouterr().out
  lines = [r.getMessage() for r in caplog.records if " progress: " in r.getMessage()]
  assert [line.split(", ")[1] for line in lines] == ["1 of 2 tars (50.0%)", "2 of 2 tars (100.0%)"]
  assert lines[-1].startswith("imagenet21k/winter2021 progress: 6 images, ")
  assert tfds.core.utils.tqdm_utils._active  # noqa: SLF001  (the shard writing's bar and later)
  tfds.disable_progress_bar()
  builder = datasets.get_builder("imagenet21k/winter2021", str(tmp_path / "data"))
  assert builder.info.features["label"].names == wnids
  assert builder.info.splits["full"].num_examples == 6
