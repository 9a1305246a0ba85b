"""Where a study keeps its runs: the workdirs under its root, the done runs in its archive.

- `<root>/runs/<run id>` (`run_dir`): a run's workdir on the machine that trains it
  (checkpoints, train.log, the trainer's files).
- `<archive>/runs/<run id>` (`archived_dir`): a done run's ARCHIVED_FILES and provenance.json,
  no checkpoints; where the reports look (`sweep.workdir`). A run in the archive is never
  trained again, whatever became of `<root>`.
- `<archive>/<sweep>/<run id>`: a link to it from each sweep that lists it, for browsing.
- `<archive>/parked/<run id>`: a run not done yet, carried between machines (parking.py).
- `<archive>/study.json` (STUDY_FILE): the plan and the commit its trainers are pinned to.
"""
from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

from big_vision_relu.experiments import parking, plans, run_status
from big_vision_relu.experiments import provenance as provenance_lib
from big_vision_relu.experiments import sweep as sweep_lib

STUDY_FILE = "study.json"
DONE = ("finished", "diverged")
# What the archive keeps of a run (the reports read these; checkpoints stay behind).
ARCHIVED_FILES = ("config.json", "metrics.jsonl", provenance_lib.LAUNCHES_FILE,
                  run_status.DIVERGED_FILE)


def run_dir(root: pathlib.Path, run: sweep_lib.Run) -> pathlib.Path:
  return root / "runs" / run.run_id


def archived_dir(archive: pathlib.Path, run: sweep_lib.Run) -> pathlib.Path:
  return archive / "runs" / run.run_id


def status(root: pathlib.Path, archive: pathlib.Path, run: sweep_lib.Run) -> str:
  """'finished' or 'diverged' if the run is done (archived, or done in its workdir), else
  'running' (started: in its workdir, or parked in the archive) or 'missing' (`run_status`'s
  rules)."""
  archived = run_status.collect_run(run, archived_dir(archive, run)).status
  if archived in DONE:
    return archived
  state = run_status.collect_run(run, run_dir(root, run)).status
  parked = parking.parked_dir(archive, run.run_id)
  return "running" if state == "missing" and parking.newest_step(parked) is not None else state


def archive_run(root: pathlib.Path, archive: pathlib.Path, item: plans.PlannedRun,
                provenance: dict[str, Any] | None = None) -> None:
  """Copies a done run's ARCHIVED_FILES to the archive (replacing any older copy whole: the new
  one is complete before it is renamed into place), with `provenance` (commit, machine) as
  provenance.json, links it from its sweeps' directories and drops its parked copy, if any."""
  target = archived_dir(archive, item.run)
  partial = target.with_name(target.name + ".partial")
  shutil.rmtree(partial, ignore_errors=True)
  partial.mkdir(parents=True)
  for name in ARCHIVED_FILES:
    if (run_dir(root, item.run) / name).exists():
      shutil.copy2(run_dir(root, item.run) / name, partial / name)
  if provenance is not None:
    (partial / provenance_lib.PROVENANCE_FILE).write_text(json.dumps(provenance, indent=1) + "\n")
  shutil.rmtree(target, ignore_errors=True)
  partial.rename(target)
  link_sweep_dirs(archive, item)
  parking.drop(archive, item.run.run_id)


def link_sweep_dirs(archive: pathlib.Path, item: plans.PlannedRun) -> None:
  """<archive>/<sweep>/<run id> -> ../runs/<run id> for every sweep of the run."""
  for name in item.sweeps:
    link = pathlib.Path(sweep_lib.sweep_link(str(archive), name, item.run))
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
      link.symlink_to(pathlib.Path("..") / "runs" / item.run.run_id)
