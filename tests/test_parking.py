"""Parking runs not yet archived in the archive (experiments/parking.py): what is packed, that
nothing ahead is ever replaced, and that nothing stays once the run is archived. The end-to-end
resume on a fresh machine is in test_study.py."""
import json
import shutil
import tarfile

from big_vision_relu.experiments import archive as archive_lib
from big_vision_relu.experiments import parking
from big_vision_relu.experiments.studies import repro


def _workdir(path, steps, metrics_steps=()):
  """A stopped trainer's workdir: checkpoints at `steps` (plus a step orbax was still writing),
  its config and launch record, metrics at `metrics_steps`."""
  for step in steps:
    (path / "checkpoints" / str(step) / "state").mkdir(parents=True)
    (path / "checkpoints" / str(step) / "state" / "data").write_text(f"state at {step}")
  (path / "checkpoints" / "9.orbax-checkpoint-tmp-1").mkdir(parents=True)
  (path / "config.json").write_text('{"seed": 0}')
  (path / "launches.jsonl").write_text('{"resumes_from_step": 0}\n')
  (path / "metrics.jsonl").write_text(
      "".join(json.dumps({"step": s, "training_loss": 1 / s}) + "\n" for s in metrics_steps))
  (path / "events.out.tfevents.1.vm").write_text("tensorboard")
  return path


def _files(path):
  return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def _packed(parked, step):
  """{name: bytes} of the files in the parked copy's packed checkpoint at `step`."""
  with tarfile.open(parked / "checkpoints" / f"{step}{parking.PACKED}") as packed:
    return {m.name: packed.extractfile(m).read() for m in packed.getmembers() if m.isfile()}


def test_park_copies_the_newest_checkpoint_and_the_run_files_and_never_goes_back(tmp_path):
  workdir = _workdir(tmp_path / "run", [4, 8], metrics_steps=[2, 4, 6, 8])
  parked = tmp_path / "archive" / parking.PARKED_DIR / "run"
  assert parking.park(workdir, parked) == 8
  assert _files(parked) == [f"checkpoints/8{parking.PACKED}", "config.json", "launches.jsonl",
                            "metrics.jsonl"]
  assert _packed(parked, 8) == {"8/state/data": b"state at 8"}  # the newest step only
  assert (parked / "metrics.jsonl").read_text() == (workdir / "metrics.jsonl").read_text()
  assert parking.park(workdir, parked) is None  # already parked at step 8
  # A workdir behind the parked copy (e.g. restarted elsewhere) never replaces it.
  behind = _workdir(tmp_path / "behind", [4])
  assert parking.park(behind, parked) is None
  assert parking.newest_step(parked) == 8
  # A later one replaces it whole, leaving no partial copy behind.
  (workdir / "checkpoints" / "12" / "state").mkdir(parents=True)
  assert parking.park(workdir, parked) == 12
  assert sorted(p.name for p in (parked / "checkpoints").iterdir()) == [f"12{parking.PACKED}"]
  assert sorted(p.name for p in parked.parent.iterdir()) == ["run"]
  # Nothing to park without a checkpoint.
  assert parking.park(_workdir(tmp_path / "new", []), tmp_path / "p2") is None
  assert not (tmp_path / "p2").exists()


def test_unpark_fills_a_workdir_that_is_behind_and_moves_the_old_one_aside(tmp_path):
  parked = _workdir(tmp_path / "source", [8])
  parking.park(parked, tmp_path / "parked")
  parked = tmp_path / "parked"
  # A fresh machine: no workdir at all.
  fresh = tmp_path / "root" / "runs" / "run"
  assert parking.unpark(parked, fresh) == 8
  assert _files(fresh) == ["checkpoints/8/state/data", "config.json", "launches.jsonl",
                           "metrics.jsonl"]
  for name in _files(fresh):  # the trainer's own files, unpacked
    assert (fresh / name).read_bytes() == (tmp_path / "source" / name).read_bytes()
  # A workdir at the parked step or later is left alone.
  assert parking.unpark(parked, fresh) is None
  ahead = _workdir(tmp_path / "ahead", [12])
  assert parking.unpark(parked, ahead) is None
  assert parking.newest_step(ahead) == 12
  # One that is behind (restarted from scratch, or an older checkpoint) is moved aside.
  behind = _workdir(tmp_path / "runs" / "behind", [4], metrics_steps=[2, 4])
  assert parking.unpark(parked, behind) == 8
  assert parking.newest_step(behind) == 8
  aside = [p for p in behind.parent.iterdir() if p.name.startswith("behind.superseded-")]
  assert len(aside) == 1 and parking.newest_step(aside[0]) == 4
  assert (aside[0] / "metrics.jsonl").read_text().count("\n") == 2
  # No parked copy: nothing to do.
  assert parking.unpark(tmp_path / "none", tmp_path / "runs" / "other") is None
  assert not (tmp_path / "runs" / "other").exists()


def test_a_parked_run_counts_as_started_until_archiving_drops_it(tmp_path):
  root, archive = tmp_path / "root", tmp_path / "archive"
  item = repro.PLAN.runs([repro.PHASES[0]])[0]
  workdir = _workdir(archive_lib.run_dir(root, item.run), [500], metrics_steps=[500])
  parked = parking.parked_dir(archive, item.run.run_id)
  assert parking.park(workdir, parked) == 500
  workdir.rename(tmp_path / "elsewhere")  # a fresh machine, before the study starts
  assert archive_lib.status(root, archive, item.run) == "running"
  shutil.rmtree(parked)
  assert archive_lib.status(root, archive, item.run) == "missing"
  workdir = _workdir(archive_lib.run_dir(root, item.run), [1250], metrics_steps=[1250])
  assert parking.park(workdir, parked) == 1250
  archive_lib.archive_run(root, archive, item)
  assert not parked.exists() and archive_lib.archived_dir(archive, item.run).is_dir()


def test_park_beside_a_running_trainer_copies_whole_lines_and_outruns_its_keep_policy(
    tmp_path, monkeypatch):
  workdir = _workdir(tmp_path / "run", [4, 8], metrics_steps=[2, 4, 6, 8])
  complete = (workdir / "metrics.jsonl").read_text()
  with open(workdir / "metrics.jsonl", "a") as f:
    f.write('{"step": 10, "trai')  # the trainer is in the middle of a line
  # The trainer saves step 12 and its keep policy deletes step 8 while step 8 is being packed.
  add = tarfile.TarFile.add
  def add_racing_the_trainer(self, name, *args, **kwargs):
    if name == workdir / "checkpoints" / "8":
      (workdir / "checkpoints" / "12" / "state").mkdir(parents=True)
      (workdir / "checkpoints" / "12" / "state" / "data").write_text("state at 12")
      shutil.rmtree(name)
    return add(self, name, *args, **kwargs)
  monkeypatch.setattr(parking.tarfile.TarFile, "add", add_racing_the_trainer)
  parked = tmp_path / "parked"
  assert parking.park(workdir, parked) == 12
  assert _files(parked) == [f"checkpoints/12{parking.PACKED}", "config.json", "launches.jsonl",
                            "metrics.jsonl"]
  assert _packed(parked, 12) == {"12/state/data": b"state at 12"}
  assert (parked / "metrics.jsonl").read_text() == complete
  for name in ("config.json", "launches.jsonl"):  # whole: the one has no newline at its end
    assert (parked / name).read_text() == (workdir / name).read_text()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["parked", "run"]  # no partial copy


def test_a_parked_copy_from_before_packing_unparks(tmp_path):
  """A run parked by an older checkout (its step directory itself, not packed) resumes alike."""
  parked = _workdir(tmp_path / "parked", [8])
  shutil.rmtree(parked / "checkpoints" / "9.orbax-checkpoint-tmp-1")
  workdir = tmp_path / "runs" / "run"
  assert parking.newest_step(parked) == 8
  assert parking.unpark(parked, workdir) == 8
  assert _files(workdir) == _files(parked)
