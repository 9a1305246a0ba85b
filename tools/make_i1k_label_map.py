"""Writes the ImageNet-21k -> ImageNet-1k label map shipped in ``big_vision_relu/data/``.

Sources (facts, nothing downloaded at run time):

- Google's 21,843-class ImageNet-21k order (the class order of big_vision's ImageNet-21k
  models): ``timm/data/_info/imagenet21k_goog_synsets.txt`` inside timm's wheel, one wordnet
  id per line. Get the wheel without timm's torch dependency::

      pip download --no-deps timm==1.0.31 -d /tmp/timm_whl

- The 1,000 ImageNet-1k wordnet ids in TFDS ``imagenet2012`` label order:
  ``tensorflow_datasets/datasets/imagenet2012/labels.txt`` in the installed
  tensorflow-datasets.

Outputs (no header lines, so line number - 1 = class index for any reader):

- ``imagenet21k_wnids.txt``: 21,843 lines, line i = wordnet id of ImageNet-21k class i.
- ``i21k_to_i1k.txt``: 1,000 lines, line j = ``<index> <wnid>``: the ImageNet-21k class index
  of ImageNet-1k class j, and that class's wordnet id (so the file checks itself). One
  ImageNet-1k class has no ImageNet-21k counterpart: class 850, ``n04399382`` ("teddy, teddy
  bear"), is not in the fall 2011 ImageNet-21k release nor in Google's 21,843 order; its index
  is written as ``-1``. Any other absent class is an error (it would mean a wrong input file).

Usage::

    python tools/make_i1k_label_map.py /tmp/timm_whl/timm-1.0.31-py3-none-any.whl
    python tools/make_i1k_label_map.py path/to/imagenet21k_goog_synsets.txt \
        --i1k-labels path/to/labels.txt --out-dir big_vision_relu/data
"""

from __future__ import annotations

import argparse
import pathlib
import re
import zipfile

NUM_I21K = 21843
NUM_I1K = 1000
WHEEL_MEMBER = "timm/data/_info/imagenet21k_goog_synsets.txt"
MISSING = -1
# ImageNet-1k wordnet ids known to be absent from ImageNet-21k (see the module docstring).
KNOWN_ABSENT = frozenset({"n04399382"})
_WNID = re.compile(r"n\d{8}")


def read_wnids(text: str, expected: int, source: str) -> list[str]:
  """Parses one wordnet id per line; checks format, count and uniqueness."""
  wnids = text.split()
  bad = [w for w in wnids if not _WNID.fullmatch(w)]
  if bad:
    raise ValueError(f"{source}: not wordnet ids: {bad[:5]}")
  if len(wnids) != expected:
    raise ValueError(f"{source}: expected {expected} wordnet ids, found {len(wnids)}")
  if len(set(wnids)) != len(wnids):
    raise ValueError(f"{source}: repeated wordnet ids")
  return wnids


def read_i21k_wnids(path: pathlib.Path) -> list[str]:
  """The 21,843 ids from timm's wheel (``.whl``) or from the extracted synsets txt."""
  if path.suffix == ".whl":
    with zipfile.ZipFile(path) as wheel:
      text = wheel.read(WHEEL_MEMBER).decode("ascii")
  else:
    text = path.read_text(encoding="ascii")
  return read_wnids(text, NUM_I21K, str(path))


def default_i1k_labels() -> pathlib.Path:
  """TFDS's imagenet2012 ``labels.txt`` in the installed tensorflow-datasets."""
  import importlib.util

  # find_spec locates the package without importing it (importing TFDS pulls TensorFlow).
  spec = importlib.util.find_spec("tensorflow_datasets")
  if spec is None or spec.origin is None:
    raise FileNotFoundError("tensorflow_datasets is not installed; pass --i1k-labels")
  return pathlib.Path(spec.origin).parent / "datasets" / "imagenet2012" / "labels.txt"


def i1k_indices(i21k_wnids: list[str], i1k_wnids: list[str]) -> list[int]:
  """Index in ``i21k_wnids`` of each ImageNet-1k class, in ImageNet-1k order; ``MISSING``
  for the classes in ``KNOWN_ABSENT``."""
  position = {w: i for i, w in enumerate(i21k_wnids)}
  unexpected = [w for w in i1k_wnids if w not in position and w not in KNOWN_ABSENT]
  if unexpected:
    raise ValueError(f"ImageNet-1k classes absent from the 21k list: {unexpected}")
  return [position.get(w, MISSING) for w in i1k_wnids]


def render(i21k_wnids: list[str], i1k_wnids: list[str]) -> tuple[str, str]:
  """Contents of (``imagenet21k_wnids.txt``, ``i21k_to_i1k.txt``)."""
  indices = i1k_indices(i21k_wnids, i1k_wnids)
  wnids_txt = "".join(f"{w}\n" for w in i21k_wnids)
  map_txt = "".join(f"{i} {w}\n" for i, w in zip(indices, i1k_wnids))
  return wnids_txt, map_txt


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "i21k_synsets", type=pathlib.Path, help="timm wheel (.whl) or imagenet21k_goog_synsets.txt"
  )
  parser.add_argument(
    "--i1k-labels",
    type=pathlib.Path,
    default=None,
    help="TFDS imagenet2012 labels.txt (default: the installed TFDS copy)",
  )
  parser.add_argument(
    "--out-dir",
    type=pathlib.Path,
    default=pathlib.Path(__file__).resolve().parents[1] / "big_vision_relu" / "data",
  )
  args = parser.parse_args()
  i1k_path = args.i1k_labels or default_i1k_labels()
  i21k = read_i21k_wnids(args.i21k_synsets)
  i1k = read_wnids(i1k_path.read_text(encoding="ascii"), NUM_I1K, str(i1k_path))
  wnids_txt, map_txt = render(i21k, i1k)
  (args.out_dir / "imagenet21k_wnids.txt").write_text(wnids_txt, encoding="ascii")
  (args.out_dir / "i21k_to_i1k.txt").write_text(map_txt, encoding="ascii")
  print(f"wrote {NUM_I21K} + {NUM_I1K} lines to {args.out_dir}")


if __name__ == "__main__":
  main()
