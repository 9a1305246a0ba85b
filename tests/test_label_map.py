"""The packaged ImageNet-21k order and i21k -> i1k map, checked against TFDS's i1k labels."""

import importlib.util
import pathlib
import re

import numpy as np
import pytest

from big_vision_relu.data import label_maps

REPO = pathlib.Path(__file__).resolve().parents[1]


def _tfds_i1k_wnids() -> list[str]:
  """ImageNet-1k wordnet ids in TFDS label order, from the installed tensorflow-datasets
  (located without importing it, which would pull TensorFlow)."""
  origin = importlib.util.find_spec("tensorflow_datasets").origin
  path = pathlib.Path(origin).parent / "datasets" / "imagenet2012" / "labels.txt"
  return path.read_text().split()


def _tool():
  spec = importlib.util.spec_from_file_location(
    "make_i1k_label_map", REPO / "tools" / "make_i1k_label_map.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_i21k_wnids():
  wnids = label_maps.imagenet21k_wnids()
  assert len(wnids) == 21843 and len(set(wnids)) == 21843
  assert all(re.fullmatch(r"n\d{8}", w) for w in wnids)
  # Google's order starts with the WordNet roots, not sorted ImageNet-1k classes.
  assert wnids[:3] == ["n00004475", "n00005787", "n00006024"]


def test_i1k_map_against_tfds_labels():
  i1k = _tfds_i1k_wnids()
  assert len(i1k) == 1000
  assert label_maps.imagenet1k_wnids() == i1k
  idx = label_maps.i21k_to_i1k_indices()
  assert idx.shape == (1000,) and idx.dtype == np.int64
  wnids = label_maps.imagenet21k_wnids()
  # Exactly one class, 850 = teddy bear, is absent from ImageNet-21k.
  assert np.flatnonzero(idx == label_maps.MISSING).tolist() == [label_maps.I1K_ABSENT_CLASS]
  assert i1k[label_maps.I1K_ABSENT_CLASS] == "n04399382" and "n04399382" not in wnids
  present = np.delete(idx, label_maps.I1K_ABSENT_CLASS)
  assert len(set(present.tolist())) == 999
  assert present.min() >= 0 and present.max() < 21843
  for j, i in enumerate(idx):
    if i != label_maps.MISSING:
      assert wnids[i] == i1k[j], j
  assert idx[0] == 359 and wnids[359] == "n01440764"  # tench


def test_tool_regenerates_the_packaged_files(tmp_path):
  tool = _tool()
  wnids_txt, map_txt = tool.render(label_maps.imagenet21k_wnids(), _tfds_i1k_wnids())
  data = REPO / "big_vision_relu" / "data"
  assert wnids_txt == (data / "imagenet21k_wnids.txt").read_text()
  assert map_txt == (data / "i21k_to_i1k.txt").read_text()


def test_tool_rejects_bad_inputs():
  tool = _tool()
  wnids = label_maps.imagenet21k_wnids()
  i1k = _tfds_i1k_wnids()
  with pytest.raises(ValueError, match="n01440764"):  # An i1k class missing unexpectedly.
    tool.i1k_indices([w for w in wnids if w != "n01440764"], i1k)
  with pytest.raises(ValueError, match="expected 21843"):
    tool.read_wnids("\n".join(wnids[:-1]), 21843, "short list")
  with pytest.raises(ValueError, match="repeated"):
    tool.read_wnids("\n".join(wnids[:-1] + wnids[:1]), 21843, "duplicated list")
