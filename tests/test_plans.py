"""The study core and its plug-ins (experiments/plans.py, experiments/studies/): every study
plans exactly the runs, in exactly the order, that it planned before the core was split from
the studies (tests/planned_runs.json, written from d165510's `study.plan`; alpha_length_controls'
runs from the commits that added control (a) and control (b), before any of them started),
its archive still
fits it, its sweep files list its sweeps, and launch/study.sh gets what its case statement
used to say."""
import json
import os
import subprocess

import pytest
from conftest import ROOT

from big_vision_relu.experiments import plans, report, study
from big_vision_relu.experiments import sweep as sweep_lib

PINNED = json.loads((ROOT / "tests" / "planned_runs.json").read_text())
SWEEP_DIRS = {"repro": "configs/repro", "fmnist": "configs/study",
              "alpha_length": "configs/alpha_length"}


def test_the_core_finds_every_study_by_name_and_only_those():
  assert set(PINNED) <= set(plans.names())
  for name in plans.names():
    assert plans.load(name).name == name
  with pytest.raises(ValueError,
                     match="the studies are alpha_length, alpha_length_controls, fmnist, repro"):
    plans.load("fmnist_vit")
  with pytest.raises(ValueError, match=r"No sweep 'fig5'; the study's sweeps are \['fig1'"):
    plans.load("repro").runs([("fig5", {})])


@pytest.mark.parametrize("name", sorted(PINNED))
def test_a_study_plans_the_runs_it_planned_before_in_the_same_order(name):
  planned = plans.load(name).runs()
  assert [[item.run.run_id, item.phase] for item in planned] == PINNED[name]


@pytest.mark.parametrize("name", ["fmnist", "repro"])
def test_every_archived_run_is_planned_and_its_links_name_a_sweep_of_the_study(name):
  """results/fmnist and results/repro are finished studies: the layout the core writes
  (archive.py) still fits them, run by run and link by link (a link made when its run was
  archived may name a sweep that lists the run no more: fmnist's calibration runs were first
  Figure 2's)."""
  plan, archive = plans.load(name), ROOT / "results" / name
  planned = {item.run.run_id: item for item in plan.runs()}
  archived = {p.name for p in (archive / "runs").iterdir()}
  assert archived == set(planned)  # finished: every planned run is archived, and only those
  links = [p for p in archive.glob("*/*") if p.is_symlink()]
  assert links
  for link in links:
    assert link.parent.name in plan.sweeps and link.name in planned, link
    assert os.readlink(link) == f"../runs/{link.name}"
  if (archive / "study.json").exists():
    assert json.loads((archive / "study.json").read_text())["plan"] == name


def test_the_running_studys_archive_holds_only_its_planned_runs():
  """results/alpha_length is being trained: what it holds so far, archived or parked, is
  planned, and its links name its sweep."""
  plan, archive = plans.load("alpha_length"), ROOT / "results" / "alpha_length"
  planned = {item.run.run_id for item in plan.runs()}
  held = [p.name for d in ("runs", "parked") if (archive / d).is_dir()
          for p in (archive / d).iterdir()]
  assert set(held) <= planned
  for link in (p for p in archive.glob("*/*") if p.is_symlink()):
    assert link.parent.name in plan.sweeps and link.name in planned, link
  assert json.loads((archive / "study.json").read_text())["plan"] == "alpha_length"


@pytest.mark.parametrize("name", sorted(SWEEP_DIRS))
def test_the_sweep_files_list_their_studys_sweeps(name):
  plan = plans.load(name)
  files = sorted((ROOT / SWEEP_DIRS[name]).glob("*.py"))
  sweeps = {path.stem: path for path in files if "def get_sweep" in path.read_text()}
  assert set(sweeps) == set(plan.sweeps)
  for sweep, path in sweeps.items():
    assert sweep_lib.load_sweep(str(path)) == plan.sweep(sweep)
    if sweep in plan.figures:
      assert sweep_lib.load_figure_spec(str(path)) == plan.figure


def test_what_launch_study_sh_is_told_of_each_plan():
  """The values of its old case statement, now from the plans."""
  assert study.settings(plans.load("repro")) == (
      "DATASETS=mnist5k,digits DATA_PACKAGES='' PINNED=false")
  for name in ("fmnist", "alpha_length", "alpha_length_controls"):
    assert study.settings(plans.load(name)) == (
        "DATASETS=mnist5k,digits,fashion_mnist_local DATA_PACKAGES=dataset-fashion-mnist "
        "PINNED=true")
  assert {name: plans.load(name).docs for name in PINNED} == {
      "repro": "docs/reproduction", "fmnist": "docs/fmnist", "alpha_length": "docs/alpha_length",
      "alpha_length_controls": "docs/alpha_length"}


def test_a_gate_keeps_closed_phases_from_training(tmp_path):
  """fmnist's recipe rules on an empty archive let only the calibration phases train; a study
  without a gate trains what is chosen."""
  fmnist, repro = plans.load("fmnist"), plans.load("repro")
  assert study.phases_to_train(fmnist, tmp_path, None) == [0, 1]
  assert study.phases_to_train(fmnist, tmp_path, [1, 4]) == [1]
  assert study.phases_to_train(repro, tmp_path, None) == list(range(len(repro.phases)))
  assert study.phases_to_train(fmnist, ROOT / "results" / "fmnist", None) == list(
      range(len(fmnist.phases)))  # accepted: every phase


def test_the_gates_order_is_the_order_runs_take_workers(tmp_path):
  """A gate that opens phase 2 before phase 0: its runs come first in what a round trains, and
  a phase the start did not choose stays out."""
  runs = {name: [sweep_lib.Run(f"configs/{name}.py", {"seed": seed}) for seed in (0, 1)]
          for name in "abc"}
  gated = plans.Plan(name="ordered", sweeps={name: (lambda r=r: r) for name, r in runs.items()},
                     phases=(("a", {}), ("b", {}), ("c", {})), datasets=(), docs="",
                     gate=lambda archive: ((2, 0), "c before a"))
  opened = study.phases_to_train(gated, tmp_path, None)
  assert opened == [2, 0] and study.phases_to_train(gated, tmp_path, [0, 1]) == [0]
  assert [item.run for item in gated.runs([gated.phases[i] for i in opened])] == [
      *runs["c"], *runs["a"]]


def test_a_study_without_a_report_says_so(tmp_path, capsys):
  unreported = plans.Plan(name="unreported", sweeps={}, phases=(), datasets=(), docs="")
  with pytest.raises(SystemExit) as exit_info:
    report.report_plan(unreported, str(tmp_path), str(tmp_path / "out"))
  assert exit_info.value.code == report.EXIT_NO_REPORT
  assert "The unreported study has no report of its own yet" in capsys.readouterr().err


def test_launch_study_sh_names_the_plans_and_reports_through_them(tmp_path):
  env = {**os.environ, "ROOT": str(tmp_path / "root"), "ARCHIVE": str(tmp_path / "archive"),
         "DOCS": str(tmp_path / "docs")}

  def launch(*args):
    return subprocess.run(["bash", str(ROOT / "launch" / "study.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
  unknown = launch("nope", "status")
  assert unknown.returncode == 2
  assert ("usage: bash launch/study.sh alpha_length|alpha_length_controls|fmnist|repro"
          in unknown.stderr)
  reported = launch("alpha_length", "report")  # its PLAN's report module, on an empty archive
  assert reported.returncode == 0, reported.stderr[-3000:]
  assert reported.stdout.split() == [str(tmp_path / "docs" / "results.md")]
  assert "0 of 75 runs archived" in (tmp_path / "docs" / "results.md").read_text()
  reported = launch("alpha_length_controls", "report")
  assert reported.returncode == 0, reported.stderr[-3000:]
  assert reported.stdout.split() == [str(tmp_path / "docs" / "controls.md")]
  assert "| none (the grid's) | - | not archived" in (tmp_path / "docs" / "controls.md").read_text()
