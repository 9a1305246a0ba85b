"""ImageNet-21k class order and the ImageNet-21k -> ImageNet-1k label map (packaged data).

Files (written by `tools/make_i1k_label_map.py`; no header lines):

- `imagenet21k_wnids.txt`: Google's 21,843-class ImageNet-21k order (the class order of
  big_vision's ImageNet-21k models), as shipped in timm's wheel
  (`timm/data/_info/imagenet21k_goog_synsets.txt`); line i = wordnet id of class i.
- `i21k_to_i1k.txt`: line j = `<index> <wnid>` for ImageNet-1k class j in TFDS
  `imagenet2012` label order.

One ImageNet-1k class has no ImageNet-21k counterpart: class `I1K_ABSENT_CLASS` (850,
`n04399382`, "teddy, teddy bear") is not in the fall 2011 ImageNet-21k release, so Google's
21,843 classes do not contain it; its index is `MISSING` (-1).

Other releases (winter 2021: `RELEASE_NUM_CLASSES`) have their own class lists, derived from
their synset tars when built (`imagenet21k/winter2021`); `i1k_indices` maps any class list to
ImageNet-1k by wnid and `release_differences` says what it lacks against Google's classes.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Sequence

import numpy as np

NUM_I21K_CLASSES = 21843
NUM_I1K_CLASSES = 1000
MISSING = -1
"""Index given to an ImageNet-1k class absent from ImageNet-21k."""
I1K_ABSENT_CLASS = 850
"""The ImageNet-1k class (`n04399382`, teddy bear) with no ImageNet-21k class."""
RELEASE_NUM_CLASSES = {"fall2011": NUM_I21K_CLASSES, "winter2021": 19167}
"""Classes per ImageNet-21k release (builder config of `imagenet21k`): fall 2011 as Google's
21,843 (21,841 with images); winter 2021 as image-net.org describes it (19,167 synsets; not
checked against the archive here, whose class list the builder derives from its tars)."""


def _read_lines(name: str) -> list[str]:
  text = importlib.resources.files(__package__).joinpath(name).read_text(encoding="ascii")
  return text.splitlines()


@functools.cache
def _i21k_wnids() -> tuple[str, ...]:
  wnids = tuple(_read_lines("imagenet21k_wnids.txt"))
  if len(wnids) != NUM_I21K_CLASSES or len(set(wnids)) != NUM_I21K_CLASSES:
    raise ValueError(
      f"imagenet21k_wnids.txt must hold {NUM_I21K_CLASSES} distinct wordnet ids, found "
      f"{len(wnids)} ({len(set(wnids))} distinct)"
    )
  return wnids


@functools.cache
def _i1k_map() -> tuple[tuple[int, ...], tuple[str, ...]]:
  indices, wnids = [], []
  for line_no, line in enumerate(_read_lines("i21k_to_i1k.txt"), start=1):
    index, wnid = line.split()
    indices.append(int(index))
    wnids.append(wnid)
    # The wnid column makes the file self-verifying against the 21k order.
    if int(index) != MISSING and _i21k_wnids()[int(index)] != wnid:
      raise ValueError(f"i21k_to_i1k.txt line {line_no}: class {index} is not {wnid}")
  if len(indices) != NUM_I1K_CLASSES:
    raise ValueError(f"i21k_to_i1k.txt must have {NUM_I1K_CLASSES} lines, has {len(indices)}")
  return tuple(indices), tuple(wnids)


def imagenet1k_wnids() -> list[str]:
  """The 1,000 ImageNet-1k wordnet ids in TFDS `imagenet2012` label order."""
  return list(_i1k_map()[1])


def imagenet21k_wnids() -> list[str]:
  """The 21,843 wordnet ids in Google's ImageNet-21k class order (index = class id)."""
  return list(_i21k_wnids())


def i21k_to_i1k_indices() -> np.ndarray:
  """int64 `[1000]`: entry j is the ImageNet-21k class index of ImageNet-1k class j.

  Entry `I1K_ABSENT_CLASS` (850, teddy bear) is `MISSING` (-1). Do not gather
  with the raw array: -1 would silently pick class 21,842 (numpy wraps negative indices and
  jax does the same). Mask that column instead, e.g. gather with `np.maximum(idx, 0)` and
  set the logits where `idx == MISSING` to `-inf` (teddy-bear images then always count
  as wrong), or drop those images from the evaluation; report which.
  """
  return np.array(_i1k_map()[0], dtype=np.int64)


def i1k_indices(wnids: Sequence[str]) -> np.ndarray:
  """int64 `[1000]`: entry j is the index in `wnids` (a 21k head's class list, e.g. a
  release's label names) of ImageNet-1k class j's wnid, or `MISSING` (-1) if absent.

  `i1k_indices(imagenet21k_wnids())` equals `i21k_to_i1k_indices()`; the same caveat about
  gathering with -1 applies.
  """
  position = {w: i for i, w in enumerate(wnids)}
  if len(position) != len(wnids):
    raise ValueError(f"class list of {len(wnids)} wnids has repeats")
  return np.array([position.get(w, MISSING) for w in _i1k_map()[1]], dtype=np.int64)


def release_differences(wnids: Sequence[str]) -> dict[str, list[str]]:
  """What a class list (e.g. a release's) lacks or adds against Google's fall 2011 classes.

  Returns sorted wnid lists: `absent_from_release` (Google's classes it lacks),
  `not_in_fall2011` (its classes outside Google's), `i1k_absent` (ImageNet-1k classes it
  lacks, whose images a label-mapped 21k head always gets wrong).
  """
  release, google = set(wnids), set(_i21k_wnids())
  return {"absent_from_release": sorted(google - release),
          "not_in_fall2011": sorted(release - google),
          "i1k_absent": sorted(set(_i1k_map()[1]) - release)}
