r"""Runs a study (its plan: phases of sweep runs) to completion, across sessions.

    python -m big_vision_relu.experiments.study --plan fmnist --root workdirs/fmnist \
        --archive results/fmnist --commit COMMIT      # run / resume, trainers pinned to COMMIT
    python -m big_vision_relu.experiments.study --plan repro --root workdirs/repro \
        --archive results/repro
    bash launch/study.sh fmnist / bash launch/repro.sh    # the same, in the background

`--plan` names a study, a unit of experiments/studies/ (`plans.load`; `plans.names()` lists
them): its phases in order, each run once (a run shared by several sweeps is trained once, in
`<root>/runs/<run id>`), and only the phases its rules let train now (`Plan.gate`: the
Fashion-MNIST study's recipe calibration, the alpha-length controls' choice), in the gate's
order; whenever a run finishes and a worker has nothing queued, it asks the gate again and
trains what it has opened since (`train_open_phases`), so one start takes a gated study as far
as its results allow, and no core waits for a round. `--workers` runs train in parallel, each
pinned to its own CPU core (on this 2-core machine two pinned runs do ~20% more work than one
run on both cores, and a run's core hours are then its own CPU time).

The archive (`--archive`; layout in archive.py): when a run is done the study copies its
results, config.json, metrics.jsonl, launches.jsonl (each start of its trainer: when, the step
it resumed from, the CPU, the speed-setting LD_PRELOAD and GLIBC_TUNABLES: `provenance.py`;
runs and steps from before that file existed ran with glibc's malloc) and DIVERGED if any, but
no checkpoints, to `<archive>/runs/<run id>`, which is where the reports look, and links it
from each of its sweeps' directories `<archive>/<sweep>/<run id>` for browsing. The study may
take more sessions than a workdir lives: a run in the archive is never trained again, whatever
became of `<root>`.

Pinned code (`--commit`): the trainers run from a git worktree of this repository at that commit
(`<root>/code`, made on first use), so changes on main never change a study mid-way; a worktree
at another commit is an error, not replaced. Only `python -m big_vision_relu.train` runs there
(a module path every commit has); the study itself and the launcher `pinned.py` run from this
checkout. The archive's `study.json` records the commit and
the first start refuses any other; each archived run gets `provenance.json` (the commit and the
machine: CPU model, cores, JAX backend and device kind).

Stopping and resuming: a run is done when it is in the archive, or when its metrics reach its
last step (`run_status`'s rule), or when its trainer stopped on a non-finite loss (the study then
writes `DIVERGED` into its workdir: a result, not retried). Anything else is (re)started; the
trainer resumes it from its last checkpoint in `<root>`, or from its parked one: `--park`
(launch/study.sh's `park`, and its `stop` after the trainers have stopped) packs the newest
checkpoint of each run not yet archived into `<archive>/parked`, and a start on any machine puts
back those its workdirs are behind (parking.py) and archives those that are done. SIGTERM / SIGINT
to the study are passed to the running trainers, which checkpoint and exit; if the study dies
without that, the kernel sends its trainers SIGTERM (PR_SET_PDEATHSIG, set by
`pinned.py`, which starts each trainer on its core). A lock file keeps a
second study from training the same runs. A run that fails is logged and skipped until the next
start of the study (its log: `<root>/runs/<run id>/train.log`).
"""
from __future__ import annotations

import ctypes.util
import fcntl
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags, logging

from big_vision_relu.experiments import archive as archive_lib
from big_vision_relu.experiments import parking, plans, pool, run_status
from big_vision_relu.experiments import provenance as provenance_lib
from big_vision_relu.experiments import sweep as sweep_lib

# The trainers' launcher, run as a file of this checkout in isolated mode (-I: neither PYTHONPATH
# nor the script's directory on sys.path), not by module path from the trainer's tree: a pinned
# worktree at an older commit has it elsewhere (big_vision_relu/pinned.py), or not at all. A
# running study starts each trainer through this path: it must not move.
PINNED_LAUNCHER = (sys.executable, "-I", str(pathlib.Path(__file__).with_name("pinned.py")))
# Every trainer runs with tcmalloc preloaded. XLA:CPU allocates its temp buffers afresh at each
# step; glibc's malloc maps them from the kernel every time, and the page faults cost ~25% of
# the Fashion-MNIST study's step; tcmalloc keeps the memory. Speed only: the results are
# bit-identical (docs/benchmarks.md section 3; tests/test_study.py).
TRAINER_MALLOC = "libtcmalloc_minimal.so.4"
TRAINER_MALLOC_PACKAGE = "libtcmalloc-minimal4"  # Debian's


def check_totals_known(planned: Sequence[plans.PlannedRun], extra_config_args: str = "") -> None:
  """Raises ValueError unless every run's total steps follow from its config
  (`run_status.total_steps`).

  The study archives a run when its metrics reach that total; without it `run_status` can only
  guess from the evaluators (a run stopped right after a step where all were due would look
  finished), so a study never starts on such a guess.
  """
  for item in planned:
    config_arg = item.run.config_arg + (f",{extra_config_args}" if extra_config_args else "")
    config = sweep_lib.load_config_file(config_arg)
    if run_status.total_steps(config) is None:
      data = config.input.data
      raise ValueError(f"{item.run.run_id}: its total steps are unknown without reading the "
                       f"dataset; add {(data.get('name'), data.get('split'))} with its size to "
                       "recipes.TRAIN_SPLIT_SIZES.")


def check_trainer_malloc() -> None:
  """Raises SystemExit, saying how to install it, unless TRAINER_MALLOC is on this machine (if
  not, the dynamic loader would only warn, and the trainers run ~1.3x slower)."""
  if ctypes.util.find_library("tcmalloc_minimal") != TRAINER_MALLOC:
    raise SystemExit(f"The study's trainers run with {TRAINER_MALLOC} preloaded (1.3x faster "
                     "steps, identical results; docs/benchmarks.md section 3), which this "
                     f"machine lacks. Fix: apt-get install {TRAINER_MALLOC_PACKAGE}")


def trainer_env(root: pathlib.Path, code: pathlib.Path | None) -> dict[str, str]:
  """This process's environment plus what every trainer gets: TRAINER_MALLOC preloaded, a JAX
  compilation cache (the study's, `root`/jax_cache, unless JAX_COMPILATION_CACHE_DIR names
  one), and the pinned code `code` (if any) ahead of any installed copy."""
  env = {"JAX_COMPILATION_CACHE_DIR": str(root / "jax_cache"), **os.environ}
  env["LD_PRELOAD"] = " ".join(filter(None, [TRAINER_MALLOC, env.get("LD_PRELOAD")]))
  if code is not None:
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
  return env


def _nonfinite_error(log: pathlib.Path) -> str | None:
  """The trainer's non-finite-loss error from the end of its log, None if it stopped otherwise."""
  with open(log, "rb") as f:
    f.seek(max(0, f.seek(0, os.SEEK_END) - 20_000))
    tail = f.read().decode(errors="replace")
  errors = [line for line in tail.splitlines() if line.startswith("FloatingPointError: ")]
  return errors[-1] if errors else None


class Study:
  """Trains the planned runs that are not finished, `workers` at a time."""

  def __init__(self, root: pathlib.Path, archive: pathlib.Path, planned: Sequence[plans.PlannedRun],
               *, workers: int, extra_config_args: str, niceness: int,
               code: pathlib.Path | None = None, commit: str | None = None,
               stopping: threading.Event | None = None):
    check_trainer_malloc()
    self.root, self.archive, self.planned, self.workers = root, archive, planned, workers
    self.extra_config_args, self.niceness = extra_config_args, niceness
    self.code = code  # the pinned worktree the trainers run from (None: this checkout)
    self.provenance = None if commit is None else {"commit": commit,
                                                   "machine": provenance_lib.machine()}
    # The caller's, if given: a stop signalled before the study exists stops it too.
    self._stopping = threading.Event() if stopping is None else stopping
    self._children: set[subprocess.Popen] = set()
    self._lock = threading.Lock()
    self.failed: list[str] = []

  def command(self, run: sweep_lib.Run, core: int | None) -> list[str]:
    """The trainer of `run`, started through this checkout's `pinned.py` on `core`."""
    config = run.config_arg + (f",{self.extra_config_args}" if self.extra_config_args else "")
    pinned = [*PINNED_LAUNCHER, f"--niceness={self.niceness}"]
    if core is not None:
      pinned.append(f"--core={core}")
    return [*pinned, "--", sys.executable, "-m", "big_vision_relu.train", "--config", config,
            "--workdir", str(archive_lib.run_dir(self.root, run))]

  @property
  def stopping(self) -> bool:
    return self._stopping.is_set()

  def stop(self, *_: Any) -> None:
    """Asks the running trainers to checkpoint and exit; starts no new run."""
    self._stopping.set()
    with self._lock:
      for child in self._children:
        child.send_signal(signal.SIGTERM)

  def _train(self, item: plans.PlannedRun, core: int | None) -> None:
    workdir = archive_lib.run_dir(self.root, item.run)
    workdir.mkdir(parents=True, exist_ok=True)
    env = trainer_env(self.root, self.code)
    started = time.monotonic()
    with open(workdir / "train.log", "ab") as log:
      with self._lock:
        if self._stopping.is_set():
          return
        provenance_lib.record_launch(workdir, env)
        child = subprocess.Popen(self.command(item.run, core), stdout=log,
                                 stderr=subprocess.STDOUT, env=env, cwd=self.code)
        self._children.add(child)
      code = child.wait()
      with self._lock:
        self._children.discard(child)
    minutes = (time.monotonic() - started) / 60
    state = archive_lib.status(self.root, self.archive, item.run)
    if code == 0 and state == "finished":
      archive_lib.archive_run(self.root, self.archive, item, self.provenance)
      logging.info("finished %s (%.1f min)", item.run.run_id, minutes)
    elif self._stopping.is_set():
      logging.info("stopped %s (%s; resumes from its checkpoint)", item.run.run_id, state)
    elif diverged := _nonfinite_error(workdir / "train.log"):
      (workdir / run_status.DIVERGED_FILE).write_text(diverged + "\n")
      archive_lib.archive_run(self.root, self.archive, item, self.provenance)
      logging.warning("DIVERGED %s (not retried): %s", item.run.run_id, diverged)
    else:
      logging.error("FAILED %s: exit code %d, %s; see %s", item.run.run_id, code, state,
                    workdir / "train.log")
      self.failed.append(item.run.run_id)

  def _not_done(self, items: Sequence[plans.PlannedRun]) -> list[plans.PlannedRun]:
    """The runs of `items` left to train. Puts back a parked checkpoint its workdir is behind;
    archives a run done in its workdir (its study stopped before archiving it); drops the parked
    copy of an archived one."""
    pending = []
    for item in items:
      archived = archive_lib.archived_dir(self.archive, item.run)
      if run_status.collect_run(item.run, archived).status in archive_lib.DONE:
        parking.drop(self.archive, item.run.run_id)  # archived by a study that did not unpark it
        continue
      parked = parking.parked_dir(self.archive, item.run.run_id)
      workdir = archive_lib.run_dir(self.root, item.run)
      if (step := parking.unpark(parked, workdir)) is not None:
        logging.info("%s resumes from its parked checkpoint, step %d", item.run.run_id, step)
      if run_status.collect_run(item.run, workdir).status in archive_lib.DONE:
        archive_lib.archive_run(self.root, self.archive, item, self.provenance)  # done before stop
      else:
        pending.append(item)
    return pending

  def run(self, max_runs: int | None = None,
          more: Callable[[], Sequence[plans.PlannedRun]] | None = None) -> None:
    """Trains the planned runs not done (the first `max_runs` of them, if given), `workers` at a
    time. `more()`, if given, is asked again whenever a worker is free, nothing is queued and a
    run has finished since it was last asked: the runs it returns that this study has not seen
    are queued (a gate opened by that run's result: `train_open_phases`). After a failed run it
    is not asked."""
    seen = {item.run.run_id for item in self.planned}
    pending = self._not_done(self.planned)
    first = pending[:max_runs]
    logging.info("%d of %d runs to do; starting %d, %d workers", len(pending), len(self.planned),
                 len(first), self.workers)

    def take() -> list[plans.PlannedRun]:
      if first:
        batch = first.copy()
        first.clear()
        return batch
      while more is not None and not self.failed:
        new = [item for item in more() if item.run.run_id not in seen]
        if not new:
          break
        seen.update(item.run.run_id for item in new)
        if batch := self._not_done(new):  # else all were done: archived now, so ask again
          logging.info("%d more runs opened; %d to train", len(new), len(batch))
          return batch
      return []

    cores = sorted(os.sched_getaffinity(0))
    pool.work_pool(self.workers, take, lambda item, index: self._train(
        item, cores[index % len(cores)] if self.workers > 1 else None), self._stopping)


def park_unarchived(root: pathlib.Path, archive: pathlib.Path,
                    planned: Sequence[plans.PlannedRun]) -> list[str]:
  """Parks (`parking.park`) every planned run that has a checkpoint and is not archived, its
  trainer running or not; a run done in its workdir too (its study stopped before archiving
  it: the next start archives it from the parked copy instead of training it again). Returns
  '<run id> at step <step>' for each."""
  parked = []
  for item in planned:
    archived = archive_lib.archived_dir(archive, item.run)
    if run_status.collect_run(item.run, archived).status not in archive_lib.DONE:
      step = parking.park(archive_lib.run_dir(root, item.run),
                          parking.parked_dir(archive, item.run.run_id))
      if step is not None:
        parked.append(f"{item.run.run_id} at step {step}")
  return parked


def pinned_worktree(root: pathlib.Path, archive: pathlib.Path, plan_name: str,
                    commit: str) -> tuple[pathlib.Path, str]:
  """(`<root>/code`, the full commit): a detached git worktree of this repository at `commit`,
  made if missing. The archive's study.json pins the study to its first commit: another commit,
  or a worktree at another commit, raises SystemExit saying what to do."""
  repo = sweep_lib.REPO

  def git(*args: str, cwd: pathlib.Path = repo) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()
  try:
    full = git("rev-parse", "--verify", f"{commit}^{{commit}}")
  except subprocess.CalledProcessError:
    raise SystemExit(f"--commit {commit!r} is not a commit of {repo}.") from None
  record = archive / archive_lib.STUDY_FILE
  if record.exists():
    pinned = json.loads(record.read_text())
    if pinned["commit"] != full or pinned["plan"] != plan_name:
      raise SystemExit(f"{record} pins this study to plan {pinned['plan']!r} at commit "
                       f"{pinned['commit']}; got plan {plan_name!r} at {full}. Resume with "
                       f"--commit {pinned['commit']}, or start a new study in another archive.")
  code = root / "code"
  if code.exists():
    current = git("rev-parse", "HEAD", cwd=code)
    if current != full:
      raise SystemExit(f"{code} is a worktree at {current}, not {full}: the study's trainers "
                       f"must not change code mid-way. Remove it (git worktree remove {code}) "
                       "only if no run of this root was trained from it.")
  else:
    git("worktree", "prune")
    git("worktree", "add", "--detach", str(code), full)
  if not record.exists():
    archive.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"plan": plan_name, "commit": full}, indent=1) + "\n")
  return code, full


def _acquire_lock(path: pathlib.Path, holder: str):
  """Holds `path` locked with this pid in it, or raises SystemExit naming the `holder` that
  does."""
  handle = open(path, "a+")  # noqa: SIM115 (held until the study ends)
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.seek(0)
    raise SystemExit(f"{holder} holds {path} (pid {handle.read().strip()}); stop it first "
                     "(kill -TERM PID) or wait for it.") from None
  handle.truncate(0)
  handle.write(str(os.getpid()))
  handle.flush()
  return handle


def print_status(root: pathlib.Path, archive: pathlib.Path, planned: Sequence[plans.PlannedRun],
                 phases: Sequence[plans.Phase]) -> None:
  """Per phase, how many runs are in each status; then, for each started run, the newest
  checkpoint step in its workdir and in the archive's parked copy ('-': none)."""
  counts: dict[int, dict[str, int]] = {}
  started = []
  for item in planned:
    phase = counts.setdefault(item.phase, dict.fromkeys(run_status.STATUSES, 0))
    state = archive_lib.status(root, archive, item.run)
    phase[state] += 1
    if state == "running":
      started.append(item.run)
  for index, (sweep, selection) in enumerate(phases):
    c = counts.get(index, dict.fromkeys(run_status.STATUSES, 0))
    print(f"phase {index}: {sweep} {selection or 'all'}: {sum(c.values())} new runs, "
          f"{c['finished']} finished, {c['diverged']} diverged, {c['running']} started, "
          f"{c['missing']} not started")
  for run in started:
    here = parking.newest_step(archive_lib.run_dir(root, run))
    parked = parking.newest_step(parking.parked_dir(archive, run.run_id))
    print(f"started {run.run_id}: checkpoint step {'-' if here is None else here} in the "
          f"workdir, {'-' if parked is None else parked} parked")


def gate_line(plan: plans.Plan, archive: pathlib.Path) -> str:
  """What the plan's gate lets a start train now, and why (for --status)."""
  closed = plan.gate(archive) if plan.gate is not None else None
  if closed is None:
    return "gate: every phase may train"
  open_phases, reason = closed
  return f"gate: phases {','.join(map(str, open_phases)) or 'none'} may train now ({reason})"


def settings(plan: plans.Plan) -> str:
  """What launch/study.sh needs of the plan, as shell assignments (`eval`ed there)."""
  values = {"DATASETS": ",".join(plan.datasets), "DATA_PACKAGES": " ".join(plan.data_packages),
            "PINNED": str(plan.pinned).lower()}
  return " ".join(f"{key}={shlex.quote(value)}" for key, value in values.items())


def phases_to_train(plan: plans.Plan, archive: pathlib.Path,
                    chosen: Sequence[int] | None) -> list[int]:
  """The indices of the phases to train, in the order their runs take workers: `chosen`
  (default: all) in phase order, less those the plan's gate keeps closed for now; a gated
  plan's in the gate's order."""
  indices = list(range(len(plan.phases))) if chosen is None else list(chosen)
  closed = plan.gate(archive) if plan.gate is not None else None
  if closed is not None:
    open_phases, reason = closed
    indices = [i for i in open_phases if i in indices]
    logging.warning("%s: only phases %s may train (%s)", plan.name,
                    ",".join(map(str, open_phases)), reason)
  return indices


def train_open_phases(plan: plans.Plan, archive: pathlib.Path, chosen: Sequence[int] | None,
                      new_study: Callable[[list[plans.PlannedRun]], Study],
                      max_runs: int | None = None) -> Study:
  """Trains the phases of `chosen` (None: all) that the plan's gate opens; whenever a worker is
  free and a run has finished, asks the gate again and trains what it has opened since (a
  candidate's result may open its comparison), until it opens nothing new and nothing trains,
  a run fails, or the study is stopped; with `max_runs` it trains what the gate opens at the
  start only. `new_study(planned)` makes the Study. Returns it."""
  def opened() -> list[plans.PlannedRun]:
    return plan.runs([plan.phases[i] for i in phases_to_train(plan, archive, chosen)])

  study = new_study(opened())
  study.run(max_runs, more=opened if plan.gate is not None and max_runs is None else None)
  return study


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}.")
  plan = plans.load(FLAGS.plan)
  if FLAGS.settings:
    print(settings(plan))
    return
  root, archive = pathlib.Path(FLAGS.root).absolute(), pathlib.Path(FLAGS.archive).absolute()
  chosen = None if FLAGS.phases is None else [int(i) for i in FLAGS.phases]
  root.mkdir(parents=True, exist_ok=True)
  phases = plan.phases if chosen is None else [plan.phases[i] for i in chosen]
  if FLAGS.status or FLAGS.park:
    planned = plan.runs(phases)
    if FLAGS.status:
      print_status(root, archive, planned, phases)
      if plan.gate is not None:
        print(gate_line(plan, archive))
      return
    # Beside a running study (parking.py says why that is safe), not another park.
    with _acquire_lock(root / "park.lock", "Another --park"):
      for line in park_unarchived(root, archive, planned):
        print(f"parked {line} in {archive / parking.PARKED_DIR}")
    return
  lock = _acquire_lock(root / "study.lock", "Another study")
  code, commit = (None, None) if FLAGS.commit is None else pinned_worktree(
      root, archive, plan.name, FLAGS.commit)
  check_totals_known(plan.runs(phases), FLAGS.config_args)  # also those a gate opens later
  stopping, current = threading.Event(), []

  def new_study(planned: list[plans.PlannedRun]) -> Study:
    current[:] = [Study(root, archive, planned, workers=FLAGS.workers,
                        extra_config_args=FLAGS.config_args, niceness=FLAGS.nice, code=code,
                        commit=commit, stopping=stopping)]
    return current[0]

  def stop(*_: Any) -> None:
    stopping.set()  # also while the gate is asked, before the study exists
    if current:
      current[0].stop()  # the running trainers checkpoint and exit
  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGINT, stop)
  study = train_open_phases(plan, archive, chosen, new_study, FLAGS.max_runs)
  lock.close()
  if study.failed:
    raise SystemExit(f"{len(study.failed)} runs failed: {', '.join(study.failed)}")


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_enum("plan", None, plans.names(), "The study (a unit of experiments/studies/).",
                    required=True)
  flags.DEFINE_string("commit", None, "Train from a worktree of the repository at this commit "
                      "(recorded in the archive and in every archived run).")
  flags.DEFINE_string("root", None, "Workdir root of the study (checkpoints, logs).",
                      required=True)
  flags.DEFINE_string("archive", None, "Where done runs' results are kept (launch/study.sh: "
                      "results/<plan>, committed); runs found there are not trained again.",
                      required=True)
  flags.DEFINE_integer("workers", 2, "Runs trained at once, each pinned to one CPU core "
                       "(1: no pinning).")
  flags.DEFINE_integer("nice", 10, "Niceness of the trainers, so interactive work goes first "
                       "(their core hours are CPU time, so they stay right).")
  flags.DEFINE_list("phases", None, "Only these phase indices of the plan's phases (default: "
                    "all; training: those its gate opens).")
  flags.DEFINE_integer("max_runs", None, "Stop after starting this many runs.")
  flags.DEFINE_string("config_args", "", "Appended to every run's config argument, e.g. "
                      "'runlocal' for a smoke study (use another --root).")
  flags.DEFINE_bool("status", False, "Print per-phase progress (and, for a gated plan, what "
                    "its gate lets train now) and exit.")
  flags.DEFINE_bool("park", False, "Pack the newest checkpoint of every started run not archived "
                    "into <archive>/parked (parking.py; the next start on any machine resumes "
                    "from it) and exit; the study may be running.")
  flags.DEFINE_bool("settings", False, "Print what launch/study.sh needs of the plan (shell "
                    "assignments) and exit.")
  app.run(main)
