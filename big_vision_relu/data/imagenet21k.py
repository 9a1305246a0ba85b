r"""ImageNet-21k as a TFDS dataset (`imagenet21k`), built from the official manual download.

Importing this module registers the builder. Build it once (no network; reads only the
manual dir) with

    python -m big_vision_relu.data.imagenet21k --release=winter2021|fall2011 --manual_dir=DIR \
        [--data_dir=TFDS_DIR]

Releases (builder configs; docs/imagenet21k.md compares them for the paper's results):

- `imagenet21k/fall2011` (default, = `imagenet21k`): Google's 21,843 classes (big_vision, ViT,
  BiT), in the order of `label_maps.imagenet21k_wnids()`, the synsets of ImageNet's fall 2011
  release (`fall11_whole.tar`, 14,197,122 images in 21,841 non-empty synsets); two of Google's
  classes have no images there, reportedly n03931044 and n09859684 (google-research/
  big_transfer issue #18, not checked here), so exactly those two may be absent; they keep
  their labels and simply have no examples.
- `imagenet21k/winter2021`: the release image-net.org offers today (`winter21_whole.tar.gz`,
  about 13.2M images; 19,167 synsets by its description, `label_maps.RELEASE_NUM_CLASSES`). Its
  exact class list is not packaged here, so the builder takes it from the synset tars in the
  manual dir, sorted by wnid (label i = i-th smallest wnid), and refuses any other number of
  tars than the release's: more means tars of another release (fall 2011) are mixed in, fewer
  a partial copy. The label names (wnids) and `release_differences` (Google's classes it lacks,
  its classes outside them, the ImageNet-1k classes it lacks) are stored with the dataset
  (`label.labels.txt`, `metadata.json`) and logged.

Any other class set is a custom `Imagenet21kConfig` (fixed `wnids` in label order plus the
`may_be_missing` classes allowed to have no images; or no `wnids` and the `num_classes` that
the derived list must have).

Manual dir: the per-synset tars `nXXXXXXXX.tar` (each a tar of JPEGs), i.e. the unpacked
outer archive (`tar xf fall11_whole.tar -C DIR`; for winter 2021 the folder holding the
`n*.tar` after `tar xzf winter21_whole.tar.gz`). Other files in it are ignored; a synset tar of a
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

Progress: while reading the tars the build logs, every `PROGRESS_SECONDS`, one line
`imagenet21k/<release> progress: <images> images, <tars done> of <tars> tars (<percent>),
<rate> images/s, ETA <hours>` (the ETA assumes the remaining tars are as full as those done;
TFDS's own progress bar is off meanwhile, as it knows no total); then TFDS's bar shows the
shard writing ("Shuffling ...", with its own ETA). `launch/tpu/data.sh` copies the newest of
these lines into data.log.
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
import time

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
PROGRESS_SECONDS = 60.0
"""How often the build logs its progress line (see the module docstring)."""

MANUAL_DOWNLOAD_INSTRUCTIONS = """\
Get one ImageNet-21k release from image-net.org (after registration) and unpack its outer
archive, one release per manual dir:

- fall 2011 (the paper's, `imagenet21k/fall2011`, the default): `fall11_whole.tar` (1.3 TB;
  image-net.org's download page may list only winter 2021: ask image-net.org or use a copy
  your organisation keeps): `tar xf fall11_whole.tar -C MANUAL_DIR`
- winter 2021 (`imagenet21k/winter2021`, its own class list): `winter21_whole.tar.gz`:
  `tar xzf winter21_whole.tar.gz -C DIR`; MANUAL_DIR is the folder that then holds the tars.

MANUAL_DIR must hold the per-synset tars `n01440764.tar`, ... directly (keep them as tars; do
not unpack them). Build with:

    python -m big_vision_relu.data.imagenet21k --release=fall2011|winter2021 \\
        --manual_dir=MANUAL_DIR --data_dir=DATA_DIR
"""


@dataclasses.dataclass(eq=False)
class Imagenet21kConfig(tfds.core.BuilderConfig):
  """A class set for `imagenet21k`: fixed (`wnids`) or derived from the manual dir.

  Attributes:
    wnids: the classes, in label order (label i is `wnids[i]`); empty: the class list is the
      sorted wnids of the synset tars in the manual dir, which must number `num_classes`.
    may_be_missing: (fixed lists only) classes allowed to have no images in the manual dir
      (no tar, or an empty one). Any other class without images is an error.
    num_classes: (derived lists only) how many classes the release has.
  """

  wnids: tuple[str, ...] = dataclasses.field(default=(), repr=False)
  may_be_missing: frozenset[str] = frozenset()
  num_classes: int | None = None

  def __post_init__(self) -> None:
    # Fail when the config is made, not hours into a build.
    if bool(self.wnids) == (self.num_classes is not None):
      raise ValueError(f"config {self.name!r}: give either wnids (a fixed class list) or "
                       "num_classes (a list derived from the manual dir), not both or neither")
    if self.num_classes is not None and (self.num_classes < 1 or self.may_be_missing):
      raise ValueError(f"config {self.name!r}: a derived class list needs num_classes >= 1 "
                       f"and no may_be_missing, got {self.num_classes}, {self.may_be_missing}")
    check_wnids(self.wnids, f"config {self.name!r}")
    unknown = sorted(set(self.may_be_missing) - set(self.wnids))
    if unknown:
      raise ValueError(f"config {self.name!r}: may_be_missing has wnids outside wnids: "
                       f"{unknown[:_NUM_SHOWN]}")


def check_wnids(wnids: collections.abc.Sequence[str], what: str) -> None:
  """Raises ValueError unless `wnids` are distinct wordnet ids (nXXXXXXXX)."""
  bad = [w for w in wnids if not _WNID.fullmatch(w)]
  if bad:
    raise ValueError(f"{what}: not wordnet ids (nXXXXXXXX): {bad[:_NUM_SHOWN]}")
  if len(set(wnids)) != len(wnids):
    duplicates = sorted(w for w, n in collections.Counter(wnids).items() if n > 1)
    raise ValueError(f"{what}: repeated wnids {duplicates[:_NUM_SHOWN]}")


FALL2011 = Imagenet21kConfig(
    name="fall2011",
    description="Google's 21,843 ImageNet-21k classes, images of the fall 2011 release.",
    wnids=tuple(label_maps.imagenet21k_wnids()),
    may_be_missing=frozenset({"n03931044", "n09859684"}),
)
WINTER2021 = Imagenet21kConfig(
    name="winter2021",
    description="The winter 2021 release; its class list is the sorted wnids of its tars.",
    num_classes=label_maps.RELEASE_NUM_CLASSES["winter2021"],
)


def find_synset_tars(manual_dir: epath.PathLike) -> dict[str, epath.Path]:
  """{wnid: path} of the files named `nXXXXXXXX.tar` directly in `manual_dir`."""
  tars = {}
  for path in epath.Path(manual_dir).iterdir():
    match = _SYNSET_TAR.fullmatch(path.name)
    if match:
      tars[match.group(1)] = path
  return tars


def class_list(config: Imagenet21kConfig, tars: collections.abc.Mapping[str, epath.Path],
               manual_dir: epath.PathLike) -> tuple[str, ...]:
  """The classes of `config` (label order) for the tars in `manual_dir`.

  Raises ValueError if a fixed class outside `may_be_missing` has no tar, or if a derived
  list does not have `num_classes` classes. Tars outside a fixed class set are logged (they
  are not part of the dataset).
  """
  where = f"imagenet21k/{config.name}"
  if not tars:
    raise ValueError(f"The manual dir {manual_dir} holds no nXXXXXXXX.tar at all: unpack the "
                     f"release into it first.\n{MANUAL_DOWNLOAD_INSTRUCTIONS}")
  if not config.wnids:
    if len(tars) != config.num_classes:
      raise ValueError(
          f"The manual dir {manual_dir} holds {len(tars)} synset tars, but {where} has "
          f"{config.num_classes} classes. "
          + ("More means tars of another release (fall 2011?) are mixed in: keep one release "
             "per manual dir. " if len(tars) > config.num_classes else
             "Fewer means a partial copy: unpack the whole archive. ")
          + "If your copy of the release really has this many classes, build a custom "
          f"Imagenet21kConfig(name=..., num_classes={len(tars)}).")
    return tuple(sorted(tars))
  missing = [w for w in config.wnids if w not in tars and w not in config.may_be_missing]
  if missing:
    raise ValueError(
        f"{len(missing)} of the {len(config.wnids)} classes of {where} have no <wnid>.tar in "
        f"the manual dir {manual_dir}, e.g. {', '.join(missing[:_NUM_SHOWN])}. Google's "
        f"class set needs the fall 2011 release; for the winter 2021 one (which removed "
        f"many synsets) build imagenet21k/winter2021; for another class set use an "
        f"Imagenet21kConfig listing the allowed absentees in may_be_missing.\n"
        f"{MANUAL_DOWNLOAD_INSTRUCTIONS}")
  extra = sorted(set(tars) - set(config.wnids))
  if extra:
    logging.warning("Ignoring %d synset tars in %s outside the %d classes of %s, e.g. %s",
                    len(extra), manual_dir, len(config.wnids), where, extra[:_NUM_SHOWN])
  return config.wnids


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


class Progress:
  """The build's progress line: images and tars done, rate and ETA (by the share of tars done).

  `update(images)` after each tar, `line()` to format it; `clock` is injectable for tests.
  """

  def __init__(self, name: str, num_tars: int, clock=time.monotonic):
    self.name, self.num_tars, self._clock = name, num_tars, clock
    self.images = self.tars = 0
    self._start = self._last = clock()

  def update(self, images: int) -> str | None:
    """Counts one more tar of `images`; returns the line if PROGRESS_SECONDS passed (or at the
    last tar), else None."""
    self.images += images
    self.tars += 1
    now = self._clock()
    if now - self._last < PROGRESS_SECONDS and self.tars < self.num_tars:
      return None
    self._last = now
    return self.line(now)

  def line(self, now: float | None = None) -> str:
    elapsed = max((self._clock() if now is None else now) - self._start, 1e-9)
    done = self.tars / max(self.num_tars, 1)
    eta = elapsed * (1 - done) / done if done else float("inf")
    return (f"{self.name} progress: {self.images:,} images, {self.tars:,} of "
            f"{self.num_tars:,} tars ({100 * done:.1f}%), {self.images / elapsed:,.0f} images/s, "
            f"ETA {eta / 3600:.1f} h")


class Imagenet21k(tfds.core.GeneratorBasedBuilder):
  """ImageNet-21k, one config per release (default: fall 2011 in Google's 21,843-class order);
  one split, `full`.

  See the module docstring for the class sets, image handling and the record order.
  """

  name = "imagenet21k"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [FALL2011, WINTER2021]
  MANUAL_DOWNLOAD_INSTRUCTIONS = MANUAL_DOWNLOAD_INSTRUCTIONS

  def __init__(self, *, file_format: str | None = None, **kwargs):
    # ArrayRecord unless asked otherwise: the input pipeline reads records by number.
    super().__init__(file_format=file_format or builders.DEFAULT_FILE_FORMAT, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    wnids = self.builder_config.wnids
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(encoding_format="jpeg",
                                         doc="JPEG bytes, as in the release when possible."),
            # A derived class list gets its names when built (restored from the data dir).
            "label": tfds.features.ClassLabel(names=list(wnids) if wnids else None,
                                              doc="Index of the wnid in the class list."),
            "file_name": tfds.features.Text(doc="<wnid>/<file name in the synset tar>"),
        }),
        supervised_keys=("image", "label"),
        homepage="https://www.image-net.org/",
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    manual_dir = dl_manager.manual_dir
    tars = find_synset_tars(manual_dir)
    wnids = class_list(self.builder_config, tars, manual_dir)
    self.info.features["label"].names = list(wnids)
    differences = label_maps.release_differences(wnids)
    self.info.metadata.update(differences)
    logging.info("imagenet21k/%s: %d classes; %s", self.builder_config.name, len(wnids),
                 {k: len(v) for k, v in differences.items()})
    # Our progress line instead of TFDS's bar, which knows no total here; the bar is made when
    # the split is generated (after this) and _generate_examples turns bars back on when done,
    # before TFDS's shard writing makes its own.
    tfds.disable_progress_bar()
    return {SPLIT: self._generate_examples(wnids, tars)}

  def _generate_examples(self, wnids: tuple[str, ...],
                         tars: collections.abc.Mapping[str, epath.Path]
                         ) -> collections.abc.Iterator[tuple[str, dict]]:
    config = self.builder_config
    num_reencoded = 0
    progress = Progress(f"imagenet21k/{config.name}", sum(w in tars for w in wnids))
    for label, wnid in enumerate(wnids):
      if wnid not in tars:
        continue  # Allowed by class_list.
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
      if line := progress.update(num_images):
        logging.info("%s", line)
    logging.info("imagenet21k/%s: re-encoded %d images as RGB JPEG.", config.name,
                 num_reencoded)
    tfds.enable_progress_bar()


def main(argv: collections.abc.Sequence[str] | None = None) -> None:
  """Command line: builds `imagenet21k/<release>` from a manual dir."""
  parser = argparse.ArgumentParser(
      description="Builds the imagenet21k TFDS dataset (ArrayRecord) of one ImageNet release "
                  "from its per-synset tars. No network.")
  parser.add_argument("--release", required=True,
                      choices=[c.name for c in Imagenet21k.BUILDER_CONFIGS],
                      help="Which release the manual dir holds (the builder config): "
                           "winter2021 is the one image-net.org offers today; fall2011 the "
                           "paper's (fall11_whole.tar).")
  parser.add_argument("--manual_dir", required=True,
                      help="Directory holding n01440764.tar, ... (the unpacked outer archive).")
  parser.add_argument("--data_dir", default=None,
                      help="TFDS data dir (default: TFDS_DATA_DIR or ~/tensorflow_datasets).")
  args = parser.parse_args(argv)
  builder = Imagenet21k(config=args.release, data_dir=args.data_dir)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=args.manual_dir, try_download_gcs=False))
  print(f"{builder.info.full_name}: {builder.data_dir} "
        f"({builder.info.splits[SPLIT].num_examples} examples)")


if __name__ == "__main__":
  main()
