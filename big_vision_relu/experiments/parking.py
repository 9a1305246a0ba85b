"""Runs not yet archived carried from machine to machine in the archive, so that a study resumes
where it stopped from any checkout.

A run's checkpoints live in its workdir (`<root>/runs/<run id>/checkpoints`), on the machine
that trains it; a session may end before the run does, and the next one may start on a fresh
machine with only what the repository holds. `park` packs a run's newest checkpoint (the
trainer's whole state at that step: parameters, optimizer state, step, RNG, and its `extra`,
the data position and core hours; no older step) into one gzip-compressed tar,
`<archive>/parked/<run id>/checkpoints/<step>.tar.gz`, beside its config.json, metrics.jsonl
(the curves so far) and launches.jsonl, committed with the archive (plain text: git stores a
file that grew by a few lines as a small delta). `unpark` unpacks it into a workdir that is
behind it, and the trainer resumes from it as from its own checkpoint (bit-identical:
tests/test_study.py). Once the run is archived the study drops its parked copy (`drop`), and
`parked/` with its last one.

The trainer may still be running (a snapshot taken at a session's end, while the study trains
on): orbax renames a checkpoint into place only when it is complete, and deletes one only after
`keep_last_ckpts` newer ones (a pack that loses that race is retried at the newer step); the
JSON-lines files are copied up to their last complete line. Metrics logged after the parked
step are logged again on resume; readers keep a step's last line (metrics.py).

Nothing is deleted that is ahead: a park never replaces a parked copy at a later step, an
unpark never touches a workdir at the parked step or later, and a workdir it replaces is moved
aside to `<run id>.superseded-<unix time>`, not deleted. A parked copy from before packing
(the step directory itself, `checkpoints/<step>/`) unparks as well.
"""
from __future__ import annotations

import pathlib
import shutil
import tarfile
import time

from big_vision_relu import multihost
from big_vision_relu.experiments import provenance, run_status

PARKED_DIR = "parked"  # in the archive
# With the newest checkpoint, what the trainer resumes from and the archive will keep (the
# mark of a diverged run included). The TensorBoard event files stay behind: metrics.jsonl
# holds the same curves.
PARKED_FILES = ("config.json", "metrics.jsonl", provenance.LAUNCHES_FILE,
                run_status.DIVERGED_FILE)
PACKED = ".tar.gz"  # a parked checkpoint: checkpoints/<step>.tar.gz holds the directory <step>


def parked_dir(archive: pathlib.Path, run_id: str) -> pathlib.Path:
  return archive / PARKED_DIR / run_id


def drop(archive: pathlib.Path, run_id: str) -> None:
  """Deletes the run's parked copy, if any, and `parked/` once it holds no other."""
  shutil.rmtree(parked_dir(archive, run_id), ignore_errors=True)
  if (archive / PARKED_DIR).is_dir() and not any((archive / PARKED_DIR).iterdir()):
    (archive / PARKED_DIR).rmdir()


def _packed_steps(checkpoints: pathlib.Path) -> list[int]:
  names = [p.name for p in checkpoints.iterdir()] if checkpoints.is_dir() else []
  return [int(n.removesuffix(PACKED)) for n in names
          if n.endswith(PACKED) and n.removesuffix(PACKED).isdigit()]


def newest_step(workdir: pathlib.Path) -> int | None:
  """The newest complete checkpoint step in `workdir`/checkpoints (a step directory, or a
  packed one in a parked copy); None if there is none."""
  steps = _packed_steps(workdir / "checkpoints")
  unpacked = multihost.latest_finalized_step(workdir / "checkpoints")
  return max([*steps, *([] if unpacked is None else [unpacked])], default=None)


def _behind(workdir: pathlib.Path, step: int) -> bool:
  """Whether `workdir` has no checkpoint at `step` or later."""
  newest = newest_step(workdir)
  return newest is None or newest < step


def _copy_whole(write, target: pathlib.Path) -> None:
  """Calls `write(tmp)` on a fresh sibling directory of `target`, then renames it to `target`,
  so that a copy cut short never takes its place."""
  tmp = target.with_name(target.name + ".copying")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.parent.mkdir(parents=True, exist_ok=True)
  write(tmp)
  shutil.rmtree(target, ignore_errors=True)
  tmp.rename(target)


def _copy_complete(source: pathlib.Path, target: pathlib.Path) -> None:
  """Copies `source`; a JSON-lines file up to its last newline (its writer, the trainer or the
  study, may be in the middle of a line). config.json is whole before the trainer starts."""
  data = source.read_bytes()
  if source.suffix == ".jsonl":
    data = data[:data.rfind(b"\n") + 1]
  target.write_bytes(data)


def park(workdir: pathlib.Path, parked: pathlib.Path, attempts: int = 3) -> int | None:
  """Packs `workdir`'s newest checkpoint into `parked`, with its PARKED_FILES (replacing an older
  parked copy whole); returns the step parked, or None if the workdir has no checkpoint or
  `parked` is already at that step or later. Its trainer may be running (module docstring)."""
  step = newest_step(workdir)
  if step is None or not _behind(parked, step):
    return None

  def write(tmp: pathlib.Path) -> None:
    (tmp / "checkpoints").mkdir(parents=True)
    with tarfile.open(tmp / "checkpoints" / f"{step}{PACKED}", "w:gz") as packed:
      packed.add(workdir / "checkpoints" / str(step), arcname=str(step))
    for name in PARKED_FILES:
      if (workdir / name).exists():
        _copy_complete(workdir / name, tmp / name)
  try:
    _copy_whole(write, parked)
  except FileNotFoundError:  # the trainer's keep policy deleted it meanwhile
    if attempts == 1:
      raise
    return park(workdir, parked, attempts - 1)
  return step


def unpark(parked: pathlib.Path, workdir: pathlib.Path) -> int | None:
  """Makes `workdir` the parked run, its checkpoint unpacked, if the workdir is behind it (no
  checkpoint, or an older one; an existing workdir is moved aside, not deleted); returns the
  step it now resumes from, or None if there is no parked copy or the workdir is at its step or
  later."""
  step = newest_step(parked)
  if step is None or not _behind(workdir, step):
    return None
  if workdir.exists():
    workdir.rename(workdir.with_name(f"{workdir.name}.superseded-{int(time.time())}"))

  def write(tmp: pathlib.Path) -> None:
    shutil.copytree(parked, tmp)
    packed = tmp / "checkpoints" / f"{step}{PACKED}"
    if packed.exists():  # else a parked copy from before packing: the step directory itself
      with tarfile.open(packed) as tar:
        tar.extractall(tmp / "checkpoints", filter="data")
      packed.unlink()
  _copy_whole(write, workdir)
  return step
