"""imagenet21k releases: fall 2011 (fixed class list) and winter 2021 (class list derived from
its tars), each built from tars of real JPEGs, with its i21k -> i1k label map."""
import importlib.util
import pathlib

import numpy as np
import pytest
import tensorflow_datasets as tfds

from big_vision_relu.data import datasets, imagenet21k, label_maps
from big_vision_relu.evaluators import classification

import imagenet21k_fixture as fixture
from conftest import block_network

GOOGLE = label_maps.imagenet21k_wnids()
ROOT_CLASS = GOOGLE[0]  # n00004475, not an ImageNet-1k class.
TENCH, GOLDFISH = "n01440764", "n01443537"  # ImageNet-1k classes 0 and 1.
TEDDY = "n04399382"  # ImageNet-1k class 850: not in fall 2011, a class of the winter fixture.
# Fall-2011-style fixture: a subset of Google's classes in Google's order (goldfish included);
# winter-2021-style: no goldfish, teddy bear added, its tars written in no particular order.
FALL_WNIDS = tuple(sorted((ROOT_CLASS, TENCH, GOLDFISH, GOOGLE[21842]), key=GOOGLE.index))
WINTER_WNIDS = (TEDDY, TENCH, ROOT_CLASS)


def _tfds_i1k_wnids() -> list[str]:
  """ImageNet-1k wnids in TFDS label order, read from TFDS's own file (not the packaged map)."""
  origin = importlib.util.find_spec("tensorflow_datasets").origin
  return (pathlib.Path(origin).parent / "datasets/imagenet2012/labels.txt").read_text().split()


def _expected_map(names: list[str]) -> list[int]:
  return [names.index(w) if w in names else -1 for w in _tfds_i1k_wnids()]


def _files(wnids, seed: int) -> dict[str, bytes]:
  rng = np.random.default_rng(seed)
  return {f"{w}/{w}_{i}.JPEG": fixture.photo_jpeg(rng, 40 + 13 * i, 56 - 7 * i)
          for w in wnids for i in range(2)}


# The fall fixture is a custom class list (fall2011's would need all 21,841 tars); the winter
# one is built with the registered config, its class count set to the fixture's (TFDS refuses
# a custom config with a registered name), and read back by its registered name.
NAMES = {"fall2011": "imagenet21k/fall2011_subset", "winter2021": "imagenet21k/winter2021"}


def _build_winter(manual_dir, data_dir, num_classes: int) -> None:
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(imagenet21k.WINTER2021, "num_classes", num_classes)
    fixture.build(manual_dir, data_dir, imagenet21k.WINTER2021)


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
  tfds.disable_progress_bar()
  root = tmp_path_factory.mktemp("releases")
  fall_files, winter_files = _files(FALL_WNIDS, 0), _files(WINTER_WNIDS, 1)
  manual_fall = fixture.write_synset_tars(root / "fall", fall_files)
  manual_winter = fixture.write_synset_tars(root / "winter", winter_files)
  with pytest.MonkeyPatch.context() as mp:
    attempts = block_network(mp)
    fixture.build(manual_fall, root / "data",
                  imagenet21k.Imagenet21kConfig(name="fall2011_subset", wnids=FALL_WNIDS))
    _build_winter(manual_winter, root / "data", len(WINTER_WNIDS))
  assert not attempts, f"the build tried the network: {attempts}"
  return {"data": root / "data", "manual_winter": manual_winter,
          "files": {"fall2011": fall_files, "winter2021": winter_files}}


@pytest.mark.parametrize("release, wnids", [("fall2011", FALL_WNIDS),
                                            ("winter2021", tuple(sorted(WINTER_WNIDS)))])
def test_label_names_and_examples(releases, release, wnids):
  builder = datasets.get_builder(NAMES[release], str(releases["data"]))
  assert builder.info.features["label"].names == list(wnids)
  examples = [fixture.parse(r) for r in fixture.records(releases["data"], NAMES[release])]
  files = releases["files"][release]
  assert sorted(name for _, _, name in examples) == sorted(files)
  for image, label, name in examples:
    assert wnids[label] == name.split("/")[0] and image == files[name], name


@pytest.mark.parametrize("release", ["fall2011", "winter2021"])
def test_label_map_per_release(releases, release):
  names = datasets.get_builder(NAMES[release], str(releases["data"])).info.features["label"].names
  expected = _expected_map(names)
  assert label_maps.i1k_indices(names).tolist() == expected
  # The i1k evaluator's map follows the dataset named in the config.
  indices = classification.label_map_indices(NAMES[release], str(releases["data"]))
  assert indices.tolist() == expected
  present = {names[i] for i in expected if i >= 0}
  assert present == ({TENCH, GOLDFISH} if release == "fall2011" else {TENCH, TEDDY})


def test_fall2011_map_is_the_packaged_one():
  assert label_maps.i1k_indices(GOOGLE).tolist() == label_maps.i21k_to_i1k_indices().tolist()
  assert (classification.label_map_indices("i21k_to_i1k").tolist()
          == _expected_map(GOOGLE))


def test_winter2021_records_what_differs_from_fall2011(releases):
  info = datasets.get_builder("imagenet21k/winter2021", str(releases["data"])).info
  assert info.metadata["not_in_fall2011"] == [TEDDY]
  assert info.metadata["absent_from_release"] == sorted(set(GOOGLE) - set(WINTER_WNIDS))
  assert info.metadata["i1k_absent"] == sorted(set(_tfds_i1k_wnids()) - {TENCH, TEDDY})


def test_mixture_of_releases_and_partial_copy_are_refused(releases, tmp_path):
  # A fall-2011 tar (goldfish) among the winter ones: more tars than the release's classes.
  mixed = fixture.write_synset_tars(tmp_path / "mixed", _files(WINTER_WNIDS + (GOLDFISH,), 2))
  with pytest.raises(ValueError, match=r"holds 4 synset tars, but imagenet21k/winter2021 has "
                                       r"3 classes\. More means tars of another release"):
    _build_winter(mixed, tmp_path / "data", 3)
  with pytest.raises(ValueError, match=r"holds 3 synset tars, .* has 19167 classes\. Fewer "
                                       r"means a partial copy"):
    fixture.build(releases["manual_winter"], tmp_path / "data", imagenet21k.WINTER2021)
  # The winter tars as fall 2011: 21,843 - 2 present - 2 allowed absentees missing.
  with pytest.raises(ValueError, match=r"21839 of the 21843 classes .*imagenet21k/winter2021"):
    fixture.build(releases["manual_winter"], tmp_path / "data", imagenet21k.FALL2011)


def test_registered_releases(tmp_path):
  configs = {c.name: c for c in imagenet21k.Imagenet21k.BUILDER_CONFIGS}
  assert list(configs) == ["fall2011", "winter2021"]
  assert configs["winter2021"].num_classes == label_maps.RELEASE_NUM_CLASSES["winter2021"]
  builder = tfds.builder("imagenet21k/winter2021", data_dir=str(tmp_path))
  assert builder.info.features["label"].num_classes is None  # known once built
  with pytest.raises(datasets.DatasetNotPreparedError, match="winter21_whole.tar.gz"):
    classification.label_map_indices("imagenet21k/winter2021", str(tmp_path))
  with pytest.raises(ValueError, match="Unknown label_map"):
    classification.label_map_indices("i21k_to_i2k")
