r"""ImageNet-21k as a TFDS dataset (`imagenet21k`), built from the official manual download.

Importing this module registers the builder. Build it once (no network; reads only the
manual dir) with

    python -m big_vision_relu.data.imagenet21k --manual_dir=DIR [--data_dir=TFDS_DIR]

Classes. Google's ImageNet-21k models (big_vision, ViT, BiT) have 21,843 classes, in the order
of `label_maps.imagenet21k_wnids()`. They are the synsets of ImageNet's fall 2011 release
(`fall11_whole.tar`, 14,197,122 images in 21,841 non-empty synsets); two of Google's classes
have no images there, reportedly n03931044 and n09859684 (google-research/big_transfer issue
#18, not checked here), so the default config (`fall11`) tolerates exactly those two being
absent; they keep their labels and simply have no examples. The winter 2021 release
(`winter21_whole.tar.gz`) removed many synsets (about 19.2k remain), so it cannot give
Google's class set: building from it fails with the number of missing classes and examples.
Any other class set is a custom `Imagenet21kConfig` (`wnids` in label order, plus the
`may_be_missing` classes that are allowed to have no images).

Manual dir: the per-synset tars `nXXXXXXXX.tar` (each a flat tar of JPEGs), i.e. the unpacked
outer tar (`tar xf fall11_whole.tar -C DIR`). Other files in it are ignored; a synset tar of a
wnid outside the class set is ignored with a warning. Tars are streamed (never extracted).

Features: `image` (JPEG bytes), `label` (index of the wnid in the class list; ClassLabel names
are the wnids), `file_name` (`<wnid>/<member name in the synset tar>`, e.g.
`n01440764/n01440764_10026.JPEG`).

Images are stored as the original bytes, not re-encoded, when they are JPEGs (PIL format JPEG,
or MPO, a JPEG with extra frames that JPEG decoders read as its first frame) in RGB or
grayscale (every decoder with channels=3 makes RGB of those) and decode fully with PIL. The
few other files (e.g. CMYK JPEGs, PNGs named .JPEG) are converted by PIL to RGB (alpha and ICC
profiles dropped, EXIF orientation not applied, as for the kept JPEGs) and re-encoded as JPEG
at quality `REENCODE_QUALITY`; each one is logged. So every stored image is an RGB/grayscale
JPEG, as `decode_jpeg_and_inception_crop` needs. A file PIL cannot decode stops the build with
its tar and name (no image is dropped silently).

Split and order. One split, `full`, with every image. TFDS orders records by the md5 hash of
the split name ("full") followed by the example key, and the key is `file_name`: so the order
is a pseudo-random shuffle that depends only on the set of file names, not on the order of the
tars or of their members, nor on mtimes or the OS. The recipe's held-out slices are then well
defined: `full[:25600]` (test), `full[25600:51200]` (val), `full[51200:]` (train). These slices
are ours: big_vision's ImageNet-21k hold-out comes from Google's internal TFDS build and cannot
be reproduced bit-exactly; ours is reproducible from the same tars (the re-encoded few may
differ in bytes across PIL/libjpeg versions, never in position).

Cost: one process reads every image, decodes it once with PIL (the check above) and writes it
twice: TFDS first spills the shuffled examples to temporary bucket files in the data dir, then
writes the ArrayRecord shards (TFDS picks the number: 2,048 shards of ~0.6 GiB for 1.3 TB).
Plan for about twice the size of the tars in free space in the data dir, and hours of
single-core work.
"""
from __future__ import annotations

import argparse
import collections
import collections.abc
import dataclasses
import io
import posixpath
import re
import tarfile

from absl import logging
from etils import epath
import PIL.Image
import tensorflow_datasets as tfds

from big_vision_relu.data import builders, label_maps

SPLIT = "full"
REENCODE_QUALITY = 95
"""JPEG quality for the few re-encoded images: near-lossless (PIL's default is 75)."""

# PIL's names for files kept as they are (see the module docstring).
_KEPT_FORMATS = frozenset({"JPEG", "MPO"})
_KEPT_MODES = frozenset({"RGB", "L"})
_SYNSET_TAR = re.compile(r"(n\d{8})\.tar")
_WNID = re.compile(r"n\d{8}")
_NUM_SHOWN = 10  # How many offending wnids messages list.

MANUAL_DOWNLOAD_INSTRUCTIONS = """\
Get the ImageNet fall 2011 release, `fall11_whole.tar` (1.3 TB, from image-net.org after
registration; its download page may list only the winter 2021 release, which lacks many of
Google's 21,843 classes: ask image-net.org or use a copy your organisation keeps), and unpack
the outer tar into the manual dir:

    tar xf fall11_whole.tar -C MANUAL_DIR

MANUAL_DIR must then hold the per-synset tars `n01440764.tar`, ... directly (keep them as tars;
do not unpack them). Build with:

    python -m big_vision_relu.data.imagenet21k --manual_dir=MANUAL_DIR --data_dir=DATA_DIR
"""


@dataclasses.dataclass(eq=False)
class Imagenet21kConfig(tfds.core.BuilderConfig):
  """A class set for `imagenet21k`.

  Attributes:
    wnids: the classes, in label order (label i is `wnids[i]`).
    may_be_missing: classes allowed to have no images in the manual dir (no tar, or an empty
      one). Any other class without images is an error.
  """

  wnids: tuple[str, ...] = dataclasses.field(default=(), repr=False)
  may_be_missing: frozenset[str] = frozenset()

  def __post_init__(self) -> None:
    # Fail when the config is made, not hours into a build.
    if not self.wnids:
      raise ValueError(f"config {self.name!r}: wnids must not be empty")
    bad = [w for w in self.wnids if not _WNID.fullmatch(w)]
    if bad:
      raise ValueError(f"config {self.name!r}: not wordnet ids (nXXXXXXXX): {bad[:_NUM_SHOWN]}")
    if len(set(self.wnids)) != len(self.wnids):
      duplicates = sorted(w for w, n in collections.Counter(self.wnids).items() if n > 1)
      raise ValueError(f"config {self.name!r}: repeated wnids {duplicates[:_NUM_SHOWN]}")
    unknown = sorted(set(self.may_be_missing) - set(self.wnids))
    if unknown:
      raise ValueError(f"config {self.name!r}: may_be_missing has wnids outside wnids: "
                       f"{unknown[:_NUM_SHOWN]}")


FALL11 = Imagenet21kConfig(
    name="fall11",
    description="Google's 21,843 ImageNet-21k classes, images of the fall 2011 release.",
    wnids=tuple(label_maps.imagenet21k_wnids()),
    may_be_missing=frozenset({"n03931044", "n09859684"}),
)


def find_synset_tars(manual_dir: epath.PathLike) -> dict[str, epath.Path]:
  """{wnid: path} of the files named `nXXXXXXXX.tar` directly in `manual_dir`."""
  tars = {}
  for path in epath.Path(manual_dir).iterdir():
    match = _SYNSET_TAR.fullmatch(path.name)
    if match:
      tars[match.group(1)] = path
  return tars


def check_classes(config: Imagenet21kConfig, tars: collections.abc.Mapping[str, epath.Path],
                  manual_dir: epath.PathLike) -> None:
  """Raises ValueError if a class of `config` outside `may_be_missing` has no tar.

  Tars of wnids outside the class set are logged (they are not part of the dataset).
  """
  missing = [w for w in config.wnids if w not in tars and w not in config.may_be_missing]
  if missing:
    hint = ("It holds no nXXXXXXXX.tar at all: unpack the release into it first. " if not tars
            else "")
    raise ValueError(
        f"{len(missing)} of the {len(config.wnids)} classes of imagenet21k/{config.name} have "
        f"no <wnid>.tar in the manual dir {manual_dir}, e.g. "
        f"{', '.join(missing[:_NUM_SHOWN])}. {hint}Google's class set needs the "
        f"fall 2011 release (the winter 2021 one removed many synsets); for another class set "
        f"use an Imagenet21kConfig listing the allowed absentees in may_be_missing.\n"
        f"{MANUAL_DOWNLOAD_INSTRUCTIONS}")
  extra = sorted(set(tars) - set(config.wnids))
  if extra:
    logging.warning("Ignoring %d synset tars in %s outside the %d classes of imagenet21k/%s, "
                    "e.g. %s", len(extra), manual_dir, len(config.wnids), config.name,
                    extra[:_NUM_SHOWN])


def iter_tar_files(path: epath.Path) -> collections.abc.Iterator[tuple[str, bytes]]:
  """Yields (base name, bytes) of the regular files of a tar, streamed in stored order."""
  with path.open("rb") as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
    for member in tar:
      if member.isdir():
        continue
      if not member.isfile():
        raise ValueError(f"{path}: member {member.name!r} is not a regular file")
      yield posixpath.basename(member.name), tar.extractfile(member).read()


def as_rgb_jpeg(data: bytes, where: str) -> tuple[bytes, str | None]:
  """Returns (JPEG bytes to store, None if `data` is kept else why it was re-encoded).

  Raises ValueError (naming `where`) if PIL cannot decode `data`.
  """
  try:
    with PIL.Image.open(io.BytesIO(data)) as image:
      if image.format in _KEPT_FORMATS and image.mode in _KEPT_MODES:
        image.load()  # A full decode: truncated or corrupt data raise here.
        return data, None
      reason = f"{image.format} {image.mode}"
      rgb = image.convert("RGB")
  except Exception as e:  # PIL raises many types for bad data; all end the build here.
    raise ValueError(f"{where}: PIL cannot decode this file ({type(e).__name__}: {e})") from e
  encoded = io.BytesIO()
  rgb.save(encoded, format="JPEG", quality=REENCODE_QUALITY)
  return encoded.getvalue(), reason


class Imagenet21k(tfds.core.GeneratorBasedBuilder):
  """ImageNet-21k (fall 2011 release) in Google's 21,843-class order; one split, `full`.

  See the module docstring for the class set, image handling and the record order.
  """

  name = "imagenet21k"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [FALL11]
  MANUAL_DOWNLOAD_INSTRUCTIONS = MANUAL_DOWNLOAD_INSTRUCTIONS

  def __init__(self, *, file_format: str | None = None, **kwargs):
    # ArrayRecord unless asked otherwise: the input pipeline reads records by number.
    super().__init__(file_format=file_format or builders.DEFAULT_FILE_FORMAT, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(encoding_format="jpeg",
                                         doc="JPEG bytes, as in the release when possible."),
            "label": tfds.features.ClassLabel(names=list(self.builder_config.wnids),
                                              doc="Index of the wnid in the class list."),
            "file_name": tfds.features.Text(doc="<wnid>/<file name in the synset tar>"),
        }),
        supervised_keys=("image", "label"),
        homepage="https://www.image-net.org/",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    manual_dir = dl_manager.manual_dir
    tars = find_synset_tars(manual_dir)
    check_classes(self.builder_config, tars, manual_dir)
    return {SPLIT: self._generate_examples(tars)}

  def _generate_examples(self, tars: collections.abc.Mapping[str, epath.Path]
                         ) -> collections.abc.Iterator[tuple[str, dict]]:
    config = self.builder_config
    num_reencoded = 0
    for label, wnid in enumerate(config.wnids):
      if wnid not in tars:
        continue  # Allowed by check_classes.
      num_images = 0
      for name, data in iter_tar_files(tars[wnid]):
        file_name = f"{wnid}/{name}"
        image, reason = as_rgb_jpeg(data, f"{tars[wnid]}:{name}")
        if reason:
          num_reencoded += 1
          logging.info("Re-encoded %s (%s) as an RGB JPEG.", file_name, reason)
        num_images += 1
        # The key sets the record order (TFDS sorts by its hash): the file name, so the order
        # does not depend on how the tars were made or listed.
        yield file_name, {"image": image, "label": label, "file_name": file_name}
      if not num_images and wnid not in config.may_be_missing:
        raise ValueError(f"{tars[wnid]} holds no images, but class {wnid} is not in "
                         f"may_be_missing of imagenet21k/{config.name}")
    logging.info("imagenet21k/%s: re-encoded %d images as RGB JPEG.", config.name,
                 num_reencoded)


def main(argv: collections.abc.Sequence[str] | None = None) -> None:
  """Command line: builds `imagenet21k` (default config) from a manual dir."""
  parser = argparse.ArgumentParser(
      description="Builds the imagenet21k TFDS dataset (ArrayRecord) from the per-synset "
                  "tars of the ImageNet fall 2011 release. No network.")
  parser.add_argument("--manual_dir", required=True,
                      help="Directory holding n01440764.tar, ... (the unpacked outer tar).")
  parser.add_argument("--data_dir", default=None,
                      help="TFDS data dir (default: TFDS_DATA_DIR or ~/tensorflow_datasets).")
  args = parser.parse_args(argv)
  builder = Imagenet21k(data_dir=args.data_dir)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=args.manual_dir, try_download_gcs=False))
  print(f"{builder.info.full_name}: {builder.data_dir} "
        f"({builder.info.splits[SPLIT].num_examples} examples)")


if __name__ == "__main__":
  main()
