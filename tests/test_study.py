"""The miniature reproduction's plan and runner: a few-run study end to end (real trainers,
pinned to cores, as the full study runs them), then the report of what it produced."""
import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import FAST_COMPILE, ROOT

from big_vision_relu import checkpoint
from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import archive as archive_lib
from big_vision_relu.experiments import parking, plans, provenance, run_status, study
from big_vision_relu.experiments import tables
from big_vision_relu.experiments import sweep as sweep_lib
from big_vision_relu.experiments.studies import repro
from big_vision_relu.models.attention import PAPER_ACTIVATIONS

SWEEPS = [f"configs/repro/fig{i}.py" for i in range(1, 5)]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
  monkeypatch.chdir(ROOT)  # sweep files name configs by repository-relative paths


def test_plan_trains_each_run_once_in_phase_order_with_all_its_sweeps():
  planned = repro.PLAN.runs()
  by_sweep = {sweep_lib.sweep_name(path): {r.run_id for r in sweep_lib.load_sweep(path)}
              for path in SWEEPS}
  assert {p.run.run_id for p in planned} == set().union(*by_sweep.values())
  assert len(planned) == len({p.run.run_id for p in planned})
  for item in planned:
    assert set(item.sweeps) == {path for path, ids in by_sweep.items()
                                if item.run.run_id in ids}
  assert [p.phase for p in planned] == sorted(p.phase for p in planned)
  # The S model with relu/L, alpha 1, qk-LN, no gate, seed 0 is in every figure; it comes with
  # Figure 1's first phase, and its run id names everything it is.
  shared = next(p for p in planned if p.run.run_id ==
                "mnist_vit-S-p4-relu-a1-qk_norm-nogated-seed0")
  assert (shared.phase, set(shared.sweeps)) == (0, set(by_sweep))
  # Every L = 49 run comes before every L = 196 run.
  last_short = max(i for i, p in enumerate(planned) if p.run.args["patch"] == 4)
  first_long = min(i for i, p in enumerate(planned) if p.run.args["patch"] == 2)
  assert last_short < first_long
  # At L = 196 every attention gets its seeds (alpha 0 and 1) before any other alpha: softmax's
  # and relu's first, then the activations in SEEDED_ACTIVATIONS_ORDER.
  seeded = [p for p in planned if p.run.args["patch"] == 2 and p.run.args["seed"] > 0]
  first_fine = min(i for i, p in enumerate(planned)
                   if p.run.args["patch"] == 2 and p.run.args["alpha"] in (0.25, 0.75, 1.25))
  assert max(planned.index(p) for p in seeded) < first_fine
  order = list(dict.fromkeys(p.run.args["attention"] for p in seeded))
  assert order == ["softmax", "relu", *repro.SEEDED_ACTIVATIONS_ORDER]
  assert set(order) == {"softmax", *PAPER_ACTIVATIONS}
  # The study ends with relu6's other alphas at L = 196, after Figures 3 and 4's.
  twin_fine = [planned.index(p) for p in planned if p.run.args["patch"] == 2
               and p.run.args["attention"] == repro.RELU_TWIN and p.run.args["seed"] == 0
               and p.run.args["alpha"] in (0.25, 0.75, 1.25)]
  assert sorted(twin_fine) == list(range(len(planned) - 3, len(planned)))
  assert planned[-4].sweeps == ("fig4",)


def test_plan_rejects_a_phase_selecting_on_an_unknown_argument():
  with pytest.raises(ValueError, match=r"selects on \['variant'\]"):
    repro.PLAN.runs([("fig1", {"variant": "S/16"})])


def test_repro_run_rejects_unknown_arguments_and_pins_softmax_alpha():
  with pytest.raises(ValueError, match="Unknown study arguments"):
    repro.run(width=64)
  assert repro.run(attention="softmax", alpha=0.0) == repro.run(attention="softmax")


def _study(root, archive, *args, data_dir):
  env = {**os.environ, "TFDS_DATA_DIR": data_dir, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_COMPILE}
  # Trainers at the test's own niceness (the driver's default adds 10): beside a real study's
  # trainers they would otherwise get a sliver of a core and run past the timeout.
  return subprocess.run([sys.executable, "-m", "big_vision_relu.experiments.study",
                         "--plan", "repro", "--root", str(root), "--archive", str(archive),
                         "--nice=0", *args],
                        check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def two_run_study(offline_data_dir, tmp_path_factory):
  """(root, archive) of a study that trained phase 0's first two runs (runlocal), at once, each
  on a core of its own, as the study trains. The tests below work on copies of what it left."""
  base = tmp_path_factory.mktemp("two_run_study")
  root, archive = base / "repro", base / "archive"
  done = _study(root, archive, "--phases", "0", "--max_runs", "2", "--config_args", "runlocal",
                data_dir=offline_data_dir)
  assert done.returncode == 0, done.stderr[-3000:]
  return root, archive


def _copy(two_run_study, tmp_path):
  """A copy of the study's (root, archive) under tmp_path."""
  return tuple(shutil.copytree(path, tmp_path / path.name, symlinks=True)
               for path in two_run_study)


def test_a_two_run_study_trains_archives_reports_and_resumes(two_run_study, offline_data_dir,
                                                             tmp_path):
  root, archive = _copy(two_run_study, tmp_path)
  first_two = repro.PLAN.runs([repro.PHASES[0]])[:2]
  for item in first_two:
    assert archive_lib.status(root, archive, item.run) == "finished"
    assert (root / "runs" / item.run.run_id / "train.log").stat().st_size > 0
    # The archive keeps the results, not the checkpoints.
    archived = archive_lib.archived_dir(archive, item.run)
    assert sorted(p.name for p in archived.iterdir()) == [
        "config.json", provenance.LAUNCHES_FILE, "metrics.jsonl"]
    # One start, from scratch, with the trainers' malloc.
    launches = [json.loads(line) for line in (archived / provenance.LAUNCHES_FILE).open()]
    assert [(x["resumes_from_step"], x["LD_PRELOAD"]) for x in launches] == [
        (0, study.TRAINER_MALLOC)]
  # The figure's sweep sees the archived runs through its links; the rest is missing.
  rows = {r.run_id: r for r in run_status.collect("configs/repro/fig1.py", str(archive),
                                                  repro.FIGURE)}
  for item in first_two:
    assert rows[item.run.run_id].status == "finished"
    assert 0 <= rows[item.run.run_id].value("test/prec@1") <= 1
  assert sum(r.status == "missing" for r in rows.values()) == len(rows) - 2
  status = _study(root, archive, "--phases", "0", "--status", data_dir=offline_data_dir)
  assert ("6 new runs, 2 finished, 0 diverged, 0 started, 4 not started"
          in status.stdout), status.stdout
  # A fresh checkout has the archive but no workdirs: archived runs are not trained again.
  shutil.rmtree(root)
  again = _study(root, archive, "--phases", "0", "--max_runs", "0", data_dir=offline_data_dir)
  assert "4 of 6 runs to do" in again.stderr, again.stderr[-3000:]
  # A second study over the same root while one holds the lock refuses to start.
  with open(root / "study.lock", "a+") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    refused = _study(root, archive, "--phases", "0", "--config_args", "runlocal",
                     data_dir=offline_data_dir)
  assert refused.returncode != 0 and "Another study holds" in refused.stderr


def test_a_launch_record_says_where_the_trainer_resumes_and_what_it_preloads(tmp_path,
                                                                            monkeypatch):
  monkeypatch.setenv("LD_PRELOAD", "libfaketime.so.1")
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
  env = study.trainer_env(tmp_path, code=tmp_path / "code")
  assert env["LD_PRELOAD"] == f"{study.TRAINER_MALLOC} libfaketime.so.1"
  assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "code")
  # The study's own compilation cache, unless the environment names one (as the suite does).
  assert env["JAX_COMPILATION_CACHE_DIR"] == os.environ["JAX_COMPILATION_CACHE_DIR"]
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  assert study.trainer_env(tmp_path, None)["JAX_COMPILATION_CACHE_DIR"] == str(
      tmp_path / "jax_cache")
  provenance.record_launch(tmp_path, env)
  for step in ("2", "10", "tmp-orbax"):  # checkpoint steps, and a directory that is not one
    (tmp_path / "checkpoints" / step).mkdir(parents=True)
  provenance.record_launch(tmp_path, env)
  launches = [json.loads(line) for line in (tmp_path / provenance.LAUNCHES_FILE).open()]
  assert [x["resumes_from_step"] for x in launches] == [0, 10]
  assert all(x["cpu"] == provenance.machine()["cpu"] for x in launches)
  assert all((x["LD_PRELOAD"], x["GLIBC_TUNABLES"]) == (env["LD_PRELOAD"],
                                                        "glibc.malloc.hugetlb=1")
             for x in launches)
  assert all(x["transparent_hugepage"] == provenance.transparent_hugepages() for x in launches)


def test_the_transparent_huge_page_mode_is_the_kernels_bracketed_word(tmp_path):
  enabled = tmp_path / "enabled"
  enabled.write_text("always [madvise] never\n")  # as Linux writes it
  assert provenance.transparent_hugepages(enabled) == "madvise"
  assert provenance.transparent_hugepages(tmp_path / "absent") == "unknown"
  if provenance.THP_FILE.exists():  # this machine's own, as the launch records read it
    assert provenance.transparent_hugepages() in ("always", "madvise", "never")


def test_a_study_without_its_trainers_malloc_refuses_to_start(tmp_path, monkeypatch):
  monkeypatch.setattr(study.ctypes.util, "find_library", lambda name: None)
  with pytest.raises(SystemExit, match=f"apt-get install {study.TRAINER_MALLOC_PACKAGE}"):
    study.Study(tmp_path, tmp_path / "archive", [], workers=1, extra_config_args="",
                niceness=0)


def test_the_trainers_malloc_changes_their_speed_not_their_results(two_run_study,
                                                                   offline_data_dir, tmp_path):
  """The study's trainers changed allocator mid-study (glibc's, glibc's with huge pages,
  tcmalloc; docs/benchmarks.md section 3): legitimate only if a trainer computes the same bits
  with each. The study's first run (tcmalloc, one core) is trained again with glibc's malloc
  and with glibc's with huge pages, at once, each on one core as the study's trainers run."""
  item = repro.PLAN.runs([repro.PHASES[0]])[0]
  workdirs = {"tcmalloc": archive_lib.run_dir(two_run_study[0], item.run)}
  plain = {**os.environ, "TFDS_DATA_DIR": offline_data_dir, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": FAST_COMPILE}
  for name in provenance.SPEED_ENV:
    plain.pop(name, None)
  allocators = {"glibc": plain,
                "hugetlb": {**plain, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}}
  cores = sorted(os.sched_getaffinity(0))
  trainers = {}
  for i, (name, env) in enumerate(allocators.items()):
    workdirs[name] = tmp_path / name
    trainers[name] = subprocess.Popen(
        [*study.PINNED_LAUNCHER, f"--core={cores[i % len(cores)]}", "--", sys.executable, "-m",
         "big_vision_relu.train", "--config", f"{item.run.config_arg},runlocal", "--workdir",
         str(workdirs[name])], env=env, cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
  logs = {name: trainer.communicate(timeout=600)[0] for name, trainer in trainers.items()}
  logs["tcmalloc"] = (workdirs["tcmalloc"] / "train.log").read_text()
  for name, trainer in trainers.items():
    assert trainer.returncode == 0, logs[name][-3000:]
  for name, log in logs.items():
    assert "cannot be preloaded" not in log, name  # the loader's warning for a missing library
  speed = ("core_hours", "img/sec/core")  # what the allocator is for
  states, metrics = {}, {}
  for name, workdir in workdirs.items():
    last = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    states[name] = jax.tree.leaves(checkpoint.read_state(
        workdir / "checkpoints" / str(last), jax.sharding.SingleDeviceSharding(jax.devices()[0])))
    metrics[name] = [{k: v for k, v in json.loads(line).items() if k not in speed}
                     for line in (workdir / "metrics.jsonl").open()]
  for name in ("hugetlb", "tcmalloc"):
    assert len(metrics["glibc"]) > 1 and metrics[name] == metrics["glibc"], name
    assert len(states[name]) == len(states["glibc"]) > 0
    for a, b in zip(states["glibc"], states[name], strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_report_knows_the_size_of_mnist5k_train(offline_data_dir):
  """The report turns the study's total_epochs into steps with this size (to tell finished runs
  from started ones); it must be the real split's."""
  from big_vision_relu.data import datasets
  from big_vision_relu.experiments import recipes
  builder = datasets.get_builder("mnist5k", offline_data_dir)
  assert builder.info.splits["train"].num_examples == recipes.TRAIN_SPLIT_SIZES[
      ("mnist5k", "train")]


def test_a_diverging_run_is_marked_and_not_retried(offline_data_dir, tmp_path, monkeypatch):
  """A trainer stopped by a non-finite loss (lr 1e30) is a result: the study writes DIVERGED,
  reports no failure, the report drops its values, and the next study does not rerun it."""
  monkeypatch.setenv("TFDS_DATA_DIR", offline_data_dir)
  monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)
  config = tmp_path / "diverging.py"
  config.write_text(
      "import importlib.util\n\n\ndef get_config(arg=None):\n"
      f"  spec = importlib.util.spec_from_file_location('c', {str(ROOT / repro.CONFIG)!r})\n"
      "  module = importlib.util.module_from_spec(spec)\n  spec.loader.exec_module(module)\n"
      "  config = module.get_config(arg)\n  config.lr = 1e30\n"
      "  config.evals = {}  # nothing to wait for before the loss turns non-finite\n"
      "  return config\n")
  run = sweep_lib.Run(str(config), {"attention": "identity", "runlocal": True})
  root, archive = tmp_path / "study", tmp_path / "archive"
  planned = [plans.PlannedRun(run, 0, ())]

  def run_study():
    runner = study.Study(root, archive, planned, workers=1, extra_config_args="", niceness=0)
    runner.run()
    return runner
  assert run_study().failed == []
  workdir = root / "runs" / run.run_id
  assert (workdir / run_status.DIVERGED_FILE).read_text().startswith(
      "FloatingPointError: Non-finite loss or gradients at step ")
  for results in (workdir, archive_lib.archived_dir(archive, run)):
    row = run_status.collect_run(run, results, repro.FIGURE)
    assert (row.status, row.metrics) == ("diverged", {})
  log_size = (workdir / "train.log").stat().st_size
  assert run_study().failed == []
  assert (workdir / "train.log").stat().st_size == log_size  # not started again


def test_launch_script_stops_and_refuses_only_a_study_holding_its_lock(tmp_path):
  """launch/repro.sh trusts the pid in study.lock only while the lock is held: a stale file
  (e.g. after a reboot) must not make it signal an unrelated process."""
  script = str(ROOT / "launch" / "repro.sh")
  env = {**os.environ, "ROOT": str(tmp_path), "ARCHIVE": str(tmp_path / "archive")}

  def launch(command):
    return subprocess.run(["bash", script, command], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout
  lock_path = tmp_path / "study.lock"
  bystander = subprocess.Popen(["sleep", "60"])
  lock_path.write_text(str(bystander.pid))
  assert "no study running" in launch("stop")  # stale: nobody holds the lock
  assert bystander.poll() is None
  bystander.kill()
  bystander.wait()
  # A stand-in study: flock(1) holds the lock (its child does not) until it is killed.
  holder = subprocess.Popen(["flock", "-o", str(lock_path), "sleep", "60"],
                            start_new_session=True)
  try:
    while subprocess.run(["flock", "-n", str(lock_path), "true"], check=False).returncode == 0:
      assert holder.poll() is None
    lock_path.write_text(str(holder.pid))
    assert f"already running as pid {holder.pid}" in launch("start")
    stopped = launch("stop")  # returns once the lock is released
    assert f"asked study {holder.pid} to stop" in stopped and "study stopped" in stopped
    assert holder.wait(timeout=10) == -15  # SIGTERM
    assert subprocess.run(["flock", "-n", str(lock_path), "true"], check=False).returncode == 0
  finally:
    subprocess.run(["pkill", "-KILL", "-s", str(holder.pid)], check=False)  # flock's session


def test_recovered_archive_entries_give_the_report_their_csv_lines_back(tmp_path):
  """tools/recover_repro_archive.py turns the finished lines of a report CSV into archive
  entries from which the report writes the same lines (and skips unfinished ones)."""
  spec = importlib.util.spec_from_file_location(
      "recover", ROOT / "tools" / "recover_repro_archive.py")
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  runs = sweep_lib.load_sweep("configs/repro/fig1.py")
  values = {"test/prec@1": 0.891, "fewshot/10shot_avg": 0.6063138347260911,
            "core_hours": 0.06156503363555556, "training_loss": 0.23242759704589844}
  rows = [run_status.Row(runs[0].run_id, "mnist_vit", runs[0].args, "finished", 1250, 1250,
                         values),
          run_status.Row(runs[1].run_id, "mnist_vit", runs[1].args, "running", 500, 1250,
                         {"training_loss": 1.5})]
  csv_path = tmp_path / "fig1.csv"
  csv_path.write_text(tables.to_csv(rows, repro.FIGURE))
  archive = tmp_path / "archive"
  assert tool.recover([csv_path], archive) == [runs[0].run_id]
  assert tool.recover([csv_path], archive) == []  # already there
  collected = run_status.collect("configs/repro/fig1.py", str(archive), repro.FIGURE)
  assert collected[0] == rows[0]
  assert collected[1].status == "missing"
  assert (archive_lib.archived_dir(archive, runs[0]) / tool.RECOVERED_FILE).exists()


def test_archiving_replaces_an_older_copy_whole_and_leaves_checkpoints_behind(tmp_path):
  root, archive = tmp_path / "root", tmp_path / "archive"
  item = repro.PLAN.runs([repro.PHASES[0]])[0]
  workdir = archive_lib.run_dir(root, item.run)
  (workdir / "checkpoints" / "1250").mkdir(parents=True)
  (workdir / "config.json").write_text(
      sweep_lib.load_config(item.run).to_json_best_effort(indent=2))
  (workdir / "metrics.jsonl").write_text('{"step": 1250, "test/prec@1": 0.9}\n')
  target = archive_lib.archived_dir(archive, item.run)
  (target.parent / (target.name + ".partial")).mkdir(parents=True)  # a copy cut short
  target.mkdir()
  (target / "metrics.jsonl").write_text('{"step": 1, "test/prec@1": 0.1}\n')
  (target / "stale").write_text("from an older copy")
  archive_lib.archive_run(root, archive, item)
  assert sorted(p.name for p in target.parent.iterdir()) == [target.name]
  assert sorted(p.name for p in target.iterdir()) == ["config.json", "metrics.jsonl"]
  for path in item.sweeps:
    row = run_status.collect_run(item.run,
                                 sweep_lib.sweep_link(str(archive), path, item.run),
                                 repro.FIGURE)
    assert (row.status, row.value("test/prec@1")) == ("finished", 0.9)


def test_a_run_parked_and_resumed_on_a_fresh_machine_ends_as_if_never_stopped(two_run_study,
                                                                               offline_data_dir,
                                                                               tmp_path):
  """A run parked in the archive while its study trains on (--park, as launch/study.sh's park
  and stop do), resumes on a machine that has only the archive from the parked step, and ends
  with the metrics of the same run trained without a stop."""
  root, archive = _copy(two_run_study, tmp_path)
  item = repro.PLAN.runs([repro.PHASES[0]])[0]
  args = ("--phases", "0", "--max_runs", "1", "--config_args", "runlocal")
  whole = metrics_lib.read_metrics(archive_lib.archived_dir(archive, item.run))
  # What a trainer past its step-2 checkpoint leaves (the runlocal run checkpoints every 2 of
  # its 4 steps): the step-4 checkpoint still being written, the step-4 metrics line half
  # written; and an archive that does not have the run yet.
  workdir = archive_lib.run_dir(root, item.run)
  assert parking.newest_step(workdir) == 4
  (workdir / "checkpoints" / "4").rename(workdir / "checkpoints" / "4.orbax-checkpoint-tmp-9")
  lines = (workdir / "metrics.jsonl").read_text().splitlines(keepends=True)
  before = "".join(line for line in lines if json.loads(line)["step"] <= 2)
  (workdir / "metrics.jsonl").write_text(before + lines[-1][:20])
  shutil.rmtree(archive_lib.archived_dir(archive, item.run))
  with open(root / "study.lock", "a+") as lock:  # the study is running
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    parked = _study(root, archive, "--phases", "0", "--park", data_dir=offline_data_dir)
  assert f"parked {item.run.run_id} at step 2" in parked.stdout, parked.stderr[-3000:]
  assert (parking.parked_dir(archive, item.run.run_id) / "metrics.jsonl").read_text() == before
  status = _study(root, archive, "--phases", "0", "--status", data_dir=offline_data_dir)
  assert (f"started {item.run.run_id}: checkpoint step 2 in the workdir, 2 parked"
          in status.stdout), status.stdout
  shutil.rmtree(root)  # the next session's machine has the archive only
  resumed = _study(root, archive, *args, data_dir=offline_data_dir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumes from its parked checkpoint, step 2" in resumed.stderr
  archived = archive_lib.archived_dir(archive, item.run)
  launches = [json.loads(line) for line in (archived / provenance.LAUNCHES_FILE).open()]
  assert [x["resumes_from_step"] for x in launches] == [0, 2]
  assert not parking.parked_dir(archive, item.run.run_id).exists()
  # The curve from before the stop is kept; every result equals the uninterrupted run's.
  # (The trainer also logs the first step of each start: step 3.)
  again = metrics_lib.read_metrics(archived)
  assert list(again) == [1, 2, 3, 4] and list(whole) == [1, 2, 4]
  speed = {"img/sec/core", "core_hours"}
  for step, values in whole.items():
    assert {k: v for k, v in again[step].items() if k not in speed} == {
        k: v for k, v in values.items() if k not in speed}, step
  # A run done in its workdir whose study stopped before archiving it is parked too, and the
  # next start on a fresh machine archives it from there without training it again.
  shutil.rmtree(archived)
  parked = _study(root, archive, "--phases", "0", "--park", data_dir=offline_data_dir)
  assert f"parked {item.run.run_id} at step 4" in parked.stdout, parked.stderr[-3000:]
  shutil.rmtree(root)
  rearchived = _study(root, archive, "--phases", "0", "--max_runs", "0",
                      data_dir=offline_data_dir)
  assert "4 of 6 runs to do" in rearchived.stderr, rearchived.stderr[-3000:]
  assert metrics_lib.read_metrics(archived) == again
  assert not parking.parked_dir(archive, item.run.run_id).exists()


def test_one_start_trains_what_the_gate_opens_as_results_arrive(two_run_study, tmp_path):
  """A gate that opens phase 1 once phase 0's run is archived: one start (train_open_phases,
  one Study) takes both; the gate is asked again when a run is done and nothing is queued, until
  it opens nothing new. The two runs are done in their workdirs and not archived, so each is
  archived without training (tests/test_pool.py: idle workers take what a gate opens)."""
  root, archive = _copy(two_run_study, tmp_path)
  first, second = (item.run for item in repro.PLAN.runs([repro.PHASES[0]])[:2])
  for run in (first, second):
    shutil.rmtree(archive_lib.archived_dir(archive, run))
  asked = []

  def gate(where):
    asked.append(archive_lib.archived_dir(where, first).exists())
    return ((0, 1), "phase 0 archived") if asked[-1] else ((0,), "waiting for phase 0")

  plan = plans.Plan(name="two_rounds", sweeps={"a": lambda: [first], "b": lambda: [second]},
                    phases=(("a", {}), ("b", {})), datasets=(), docs="", pinned=False,
                    gate=gate)
  rounds = []

  def new_study(planned):
    rounds.append([item.run.run_id for item in planned])
    return study.Study(root, archive, planned, workers=1, extra_config_args="runlocal",
                       niceness=0)

  last = study.train_open_phases(plan, archive, None, new_study)
  assert rounds == [[first.run_id]] and asked == [False, True, True]
  assert not last.failed
  for run in (first, second):
    assert run_status.collect_run(run, archive_lib.archived_dir(archive, run)).status == "finished"
  # What the gate opens at the start only with max_runs, and nothing after a stop.
  shutil.rmtree(archive_lib.archived_dir(archive, second))
  rounds.clear()
  study.train_open_phases(plan, archive, None, new_study, max_runs=5)
  assert rounds == [[first.run_id, second.run_id]]
  shutil.rmtree(archive_lib.archived_dir(archive, first))
  shutil.rmtree(archive_lib.archived_dir(archive, second))
  rounds.clear()

  def stopped_study(planned):
    made = new_study(planned)
    made.stop()
    return made

  study.train_open_phases(plan, archive, None, stopped_study)
  assert rounds == [[first.run_id]]
