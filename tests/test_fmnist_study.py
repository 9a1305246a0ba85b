"""The Fashion-MNIST study: its plan, the decision rules on a synthetic archive, and a pinned
one-run study trained from a git worktree (real trainer, real checkpoints)."""
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds
from conftest import FAST_COMPILE, ROOT

from big_vision_relu import config as config_lib
from big_vision_relu.data import datasets, fashion_mnist
from big_vision_relu.experiments import archive as archive_lib
from big_vision_relu.experiments import plans, provenance, study
from big_vision_relu.experiments import sweep as sweep_lib
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist
from big_vision_relu.experiments.studies.fmnist import recipe as fmnist_recipe
from big_vision_relu.experiments.studies.fmnist import report as fmnist_report
from big_vision_relu.experiments.studies.fmnist import results as fmnist_results

SWEEPS = [f"configs/study/{name}.py"
          for name in ("calibration", "held_out", "fig1", "fig2", "fig3", "fig4",
                       "twice_as_long", "candidate")]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
  monkeypatch.chdir(ROOT)


def test_plan_trains_every_run_once_phase_a_and_calibration_first():
  planned = plans.plan(fmnist.SWEEPS, fmnist.PHASES)
  every = {r.run_id for path in SWEEPS for r in sweep_lib.load_sweep(path)}
  assert {p.run.run_id for p in planned} == every
  assert len(planned) == len(every) == 79
  # Added after the other 68 had finished: the recipe's seed-0 pair at twice its length.
  assert [p.run for p in planned[68:70]] == fmnist.twice_as_long() == [
      fmnist.run(attention=a, epochs=2 * fmnist.EPOCHS) for a in ("softmax", "relu")]
  # Rule E2, after phase 14: phase A's other seven runs at the candidate's 40 epochs (seed 0
  # first), then the candidate's seed-0 pair at 80, last.
  assert fmnist.CANDIDATE_EPOCHS == 2 * fmnist.EPOCHS == 40
  assert [p.run for p in planned[70:77]] == [
      r for r in fmnist.phase_a(40) if r not in fmnist.twice_as_long()]
  assert [p.run.args["seed"] for p in planned[70:77]] == [0, 1, 1, 1, 2, 2, 2]
  assert [p.run for p in planned[77:]] == [
      fmnist.run(attention=a, epochs=80) for a in ("softmax", "relu")]
  assert [p.phase for p in planned[68:]] == [14] * 2 + [15] * 7 + [16] * 2
  first = [p.run for p in planned[:6]]
  assert first == [fmnist.run(attention="softmax"), fmnist.run(attention="relu"),
                   *fmnist.calibration()]
  phase_a = {r.run_id for r in fmnist.phase_a()}
  assert {p.run.run_id for p in planned[:13]} == phase_a | {r.run_id for r in
                                                             fmnist.calibration()}
  assert planned[13].run == fmnist.run(attention="relu", seed=fmnist.HELD_OUT_SEED)
  # Phase D (Figure 1, L = 49) comes right after phase A and the held-out seed, before B and C.
  fig1 = {r.run_id for r in sweep_lib.load_sweep("configs/study/fig1.py")}
  assert {p.run.run_id for p in planned[14:14 + len(fig1)]} == fig1
  # Phase 11 (added in the study's twenty-sixth session) holds relu2's gated seed 1-2 pairs, and
  # nothing earlier changed by it: phase 8 keeps its four seed-0 gated runs.
  assert [p.run for p in planned if p.phase == 11] == [
      fmnist.run(attention="relu2", alpha=alpha, gated=True, seed=seed)
      for seed in (1, 2) for alpha in (0.0, 1.0)]
  assert [p.run for p in planned if p.phase == 8] == [
      fmnist.run(attention=a, alpha=alpha, gated=True) for a in ("relu", "relu2")
      for alpha in (0.0, 1.0)]
  # Figure 3's qk-LN-on and Figure 4's ungated runs are Figure 2's: one run, several sweeps.
  shared = next(p for p in planned if p.run == fmnist.run(attention="relu2", alpha=1.5))
  assert set(shared.sweeps) == {"fig2", "fig3", "fig4"}
  study.check_totals_known(planned)  # the study never guesses whether a run finished
  config = sweep_lib.load_config(planned[0].run)
  assert config.model.num_heads * 32 == config.model.width  # head dimension 32
  assert (config.input.data.name, config.total_epochs, config.lr) == (
      "fashion_mnist_local", fmnist.EPOCHS, fmnist.LR)


def test_the_two_runs_of_a_paired_difference_are_adjacent_in_the_plan():
  """The study trains two runs at once in plan order, so each seed's pair of a paired claim
  that has not started yet (Figure 1's softmax and relu/L at L = 49: phase 4; relu2's alpha 0
  and 1 at seeds 1-2, without and with the gate: phases 9 and 11) comes as two adjacent runs,
  started together or one after the other: on one machine (docs/reproduction.md 1.4)."""
  planned = plans.plan(fmnist.SWEEPS, fmnist.PHASES)
  for phase, contrast in ((4, "attention"), (9, "alpha"), (11, "alpha")):
    runs = [p.run for p in planned if p.phase == phase]
    assert runs and len(runs) % 2 == 0, phase
    for first, second in zip(runs[::2], runs[1::2]):
      assert {k for k in first.args if first.args[k] != second.args[k]} == {contrast}, (
          first.run_id, second.run_id)


def test_after_phase_a_and_d_the_runs_a_claim_needs_come_first():
  """Phases B and C start with the runs some claim of docs/reproduction.md 1.2 (the report's
  CLAIMS) judges, so a study cut short leaves out only runs no verdict needs."""
  def needed(run):
    for claim in fmnist.CLAIMS:
      seeds = fmnist.SEEDS if claim.rule == "paired" else (0,)
      for arm in (claim.a, claim.b):
        want = fmnist.run(**arm).args
        if run.args["seed"] in seeds and all(
            run.args[k] == v for k, v in want.items() if k != "seed"):
          return True
    return False

  fig1 = sweep_lib.load_sweep("configs/study/fig1.py")
  # B and C: after A, the held-out seed and D, before the recipe's checks (phases 14-16).
  later = [p for p in plans.plan(fmnist.SWEEPS, fmnist.PHASES)[14 + len(fig1):] if p.phase < 14]
  needs = [needed(p.run) for p in later]
  assert needs == sorted(needs, reverse=True) and needs.count(True) == 23, [
      (p.run.run_id, n) for p, n in zip(later, needs)]
  assert all(needed(r) for r in fig1)


def test_an_argument_at_the_configs_default_is_not_spelled():
  """lr joined the study's grid after runs had finished: at the config's own lr a run keeps its
  id and --config (it trains the same), at another lr both say so."""
  default = sweep_lib.load_config(sweep_lib.Run(fmnist.CONFIG, {}))
  # The config's defaults are the study's recipe: a bare --config trains what the study did.
  assert (default.lr, default.total_epochs) == (fmnist.BASE_LR, fmnist.EPOCHS)
  base = fmnist.run(attention="softmax", epochs=20, lr=fmnist.BASE_LR)
  assert base.run_id == "fmnist_vit-Ti-p2-softmax-a1-qk_norm-nogated-e20-seed0"
  assert "lr=" not in base.config_arg and base.args["lr"] == fmnist.BASE_LR
  other = fmnist.run(attention="softmax", epochs=20, lr=2e-3)
  assert other.run_id == "fmnist_vit-Ti-p2-softmax-a1-qk_norm-nogated-e20-seed0-lr0.002"
  assert sweep_lib.load_config(other).lr == 2e-3


def _eval_steps(total_steps):
  """The test evaluator's steps in a run of `total_steps`, as the trainer schedules them
  (`log_percent=0.125`: every ceil(T / 8) steps, and at the end)."""
  every = config_lib.get_steps({"log_percent": 0.125}, "log", total_steps=total_steps,
                               steps_per_epoch=None, batch_size=128)
  return [*range(every, total_steps, every), total_steps]


def test_the_75_percent_point_is_the_evaluation_there():
  """Rule (b) compares the end with the evaluation at 75% of the run: in a 20-epoch run
  (9,375 steps) that is step 7,032, a step after 0.75 T; the one before is at 62.5%."""
  steps = _eval_steps(9375)
  assert steps == [1172, 2344, 3516, 4688, 5860, 7032, 8204, 9375]
  curve = {s: i / 100 for i, s in enumerate(steps)}
  result = fmnist_results.RunResult(fmnist.run(), "finished", curve, 9375, None, None, {})
  assert result.accuracy_at(0.75) == curve[7032]
  assert result.accuracy_at(1.0) == result.accuracy == curve[9375]
  assert result.last_quarter_gain == curve[9375] - curve[7032]
  running = fmnist_results.RunResult(fmnist.run(), "running", curve, 9375, None, None, {})
  assert running.last_quarter_gain is None
  ten_epochs = _eval_steps(4688)
  assert ten_epochs[5] == 3516 == 0.75 * 4688


def _archive_run(archive, run, curve, transfer):
  directory = archive_lib.archived_dir(archive, run)
  directory.mkdir(parents=True)
  config = json.loads(sweep_lib.load_config(run).to_json_best_effort())
  (directory / "config.json").write_text(json.dumps(config))
  lines = [{"step": s, "test/prec@1": a, "core_hours": s / 1e4} for s, a in curve.items()]
  lines[-1][fmnist_results.TRANSFER] = transfer
  (directory / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_the_recipe_trained_twice_as_long(tmp_path, monkeypatch):
  """Rule (c) on the recipe itself: phase A's seed-0 softmax and relu/L against their twins of
  twice the length; met only if both gain < 1 point, not measured until both twins finish."""
  _set_recipe_lr(monkeypatch, fmnist.BASE_LR)
  archive = tmp_path / "archive"

  def archive_run(run, final, gap=0.003):  # a curve `gap` below its final value before the end
    total = math.ceil(run.args["epochs"] * 60000 / 128)
    _archive_run(archive, run, {s: final - gap * (s < total) for s in _eval_steps(total)},
                 transfer=0.5)

  def lines():
    return fmnist_recipe.twice_as_long_lines(fmnist_results.load_results(archive))

  e1 = ("- E1: 40 epochs is a candidate recipe (its softmax >= 89% and its last quarter adds "
        "< 0.5 points): ")
  archive_run(fmnist.run(attention="softmax"), 0.900)
  archive_run(fmnist.run(attention="relu"), 0.897)
  assert e1 + "not yet measured" in lines()
  softmax_twin, relu_twin = fmnist.twice_as_long()
  archive_run(softmax_twin, 0.905)
  assert e1 + "met" in lines()  # 90.5 >= 89, and its last quarter adds 0.3 < 0.5
  assert "| relu/L | 89.7 | - | - | - |" in lines()
  assert "- (c) on the recipe: 40 epochs gain < 1 point over 20 for softmax and relu/L: " \
         "not yet measured" in lines()
  archive_run(relu_twin, 0.909)
  assert lines()[2:4] == ["| softmax | 90.0 | 90.5 | +0.5 | +0.3 |",
                          "| relu/L | 89.7 | 90.9 | +1.2 | +0.3 |"]
  assert "- (c) on the recipe: 40 epochs gain < 1 point over 20 for softmax and relu/L: " \
         "NOT met" in lines()
  assert ("- relu/L - softmax (seed 0, one observation): -0.3 points at 20 epochs, +0.4 at 40"
          in lines())
  archive = tmp_path / "below_89"  # the same last quarter, ending below rule (a)'s 89%
  archive_run(softmax_twin, 0.889)
  assert e1 + "NOT met" in lines()
  archive = tmp_path / "late_gain"  # above 89%, but its last quarter adds 0.6 points
  archive_run(softmax_twin, 0.905, gap=0.006)
  assert e1 + "NOT met" in lines()


def test_the_candidate_recipe_trained_twice_as_long(tmp_path):
  """Rule E2's (c): the 40-epoch candidate's seed-0 pair against their 80-epoch twins; point 3
  is met only if both gain < 1 point and the candidate meets E1, not measured until both twins
  finish."""
  def archive_run(archive, attention, epochs, final, gap=0.002):  # `gap` below final till the end
    total = math.ceil(epochs * 60000 / 128)
    _archive_run(archive, fmnist.run(attention=attention, epochs=epochs),
                 {s: final - gap * (s < total) for s in _eval_steps(total)}, transfer=0.5)

  def lines(archive):
    return fmnist_recipe.candidate_lines(fmnist_results.load_results(archive))

  point_3 = ("- point 3 (#22's definition of a converged recipe, E1 and this (c); one-sided: "
             "an accuracy loss passes it): ")
  for archive, relu_80, gap in ((tmp_path / "met", 0.915, 0.002),
                                (tmp_path / "not_met", 0.917, 0.002),
                                (tmp_path / "no_e1", 0.915, 0.006)):
    archive_run(archive, "softmax", 40, 0.910, gap)
    archive_run(archive, "relu", 40, 0.906)
    # Not yet measured until the twins finish; not met at once if the candidate misses E1.
    assert point_3 + ("NOT met" if gap > 0.005 else "not yet measured") in lines(archive)
    assert "| softmax | 91.0 | - | - | - |" in lines(archive)
    archive_run(archive, "softmax", 80, 0.918)
    archive_run(archive, "relu", 80, relu_80)
  met = lines(tmp_path / "met")
  assert met[2:4] == ["| softmax | 91.0 | 91.8 | +0.8 | +0.2 |",
                      "| relu/L | 90.6 | 91.5 | +0.9 | +0.2 |"]
  assert ("- (c) on the 40-epoch candidate: 80 epochs gain < 1 point over 40 for softmax and "
          "relu/L: met") in met
  assert point_3 + "met" in met
  assert "- relu/L - softmax (seed 0, one observation): -0.4 points at 40 epochs, -0.3 at 80" \
      in met
  assert point_3 + "NOT met" in lines(tmp_path / "not_met")  # relu/L gains 1.1 points
  # The same gains, but the 40-epoch softmax's last quarter adds 0.6 points: E1 is not met.
  no_e1 = lines(tmp_path / "no_e1")
  assert "- (c) on the 40-epoch candidate: 80 epochs gain < 1 point over 40 for softmax and " \
         "relu/L: met" in no_e1
  assert point_3 + "NOT met" in no_e1


def _set_recipe_lr(monkeypatch, lr):
  """What setting fmnist.LR = lr in the source does (GRID reads it at import), in-process."""
  monkeypatch.setattr(fmnist, "LR", lr)
  monkeypatch.setattr(fmnist, "GRID", sweep_lib.Grid(
      fmnist.CONFIG, {**fmnist.GRID.defaults, "lr": lr}, fmnist.GRID.implicit))


def test_verdicts_on_a_synthetic_archive(tmp_path, monkeypatch):
  # Phase A at the config's own lr: its seed-0 runs are also the 20-epoch calibration pair.
  _set_recipe_lr(monkeypatch, fmnist.BASE_LR)
  archive = tmp_path / "archive"
  total = 9375
  steps = _eval_steps(total)
  for seed, (softmax, relu) in enumerate([(0.900, 0.860), (0.905, 0.850), (0.895, 0.858)]):
    for run, final in ((fmnist.run(attention="softmax", seed=seed), softmax),
                       (fmnist.run(attention="relu", seed=seed), relu)):
      # A curve rising to its final value, 0.3 points below it at 75% of the run.
      curve = {s: final - 0.003 * (s < total) - 0.05 * (s <= total / 2) for s in steps}
      _archive_run(archive, run, curve, transfer=0.5)
  (archive / "baselines").mkdir()
  (archive / "baselines" / "p2.json").write_text(json.dumps({
      "test/pixel_1nn": 0.855, "test/pixel_ridge": 0.81, "fewshot/pixels/10shot_avg": 0.78,
      "fewshot/random_init/seed0/10shot_avg": 0.3}))
  text = fmnist_report.write(archive, tmp_path / "out").read_text()
  assert "(6 of 79 runs finished)" in text
  # Compute by phase: the six runs' recorded core hours (0.9375 each: their last line's).
  assert "| **total** | 79 | 6 | 5.6 | " in text
  assert "Held-out seed (relu/L, seed 3): not yet measured." in text
  fig1 = text.split("| relu/L approaches or matches softmax (Fig. 1, Ti, L = 196) | ")[1]
  # -4.4 points at SE 0.4 would not hold, but relu/L's seed 1 (0.850) is below the pixel 1-NN
  # (0.855): the arm measures nothing (1.2, Baselines).
  assert fig1.startswith("relu a1 - softmax | -4.40 | ")
  assert "| not measured (relu a1: a run at or below a pixel baseline) |" in fig1.splitlines()[0]
  # Transfer by arm (1.2): 0.50 beats the random network (0.30), not raw pixels (0.78).
  assert "| relu a1 | 3 | 50.0 | **no** | yes | **no** |" in text
  assert "- (a) softmax >= 89% at 20 epochs, lr 0.001: met" in text
  assert "- (b) softmax's last quarter adds < 0.5 points at 20 epochs, lr 0.001: met" in text
  assert "- (c) 20 epochs gain < 1 point over 10 for softmax and relu/L: not yet measured" in text
  relu1 = next(line for line in text.splitlines() if line.startswith(
      f"| {fmnist.run(attention='relu', seed=1).run_id} |"))
  # 0.850 is below the pixel 1-NN (0.855): said in the row; its last quarter added 0.3 points;
  # its transfer beats the random net but not the raw pixels.
  assert relu1.split(" | ")[1:8] == ["85.0", "+0.3", "**no**", "yes", "50.0", "**no**", "yes"]
  assert (tmp_path / "out" / "curves.png").stat().st_size > 0


def test_the_curves_draw_phase_a_the_calibration_and_the_held_out_seed_only(tmp_path):
  """curves.png labels a run by attention, alpha, epochs, lr and seed: B and C's runs (qk-LN
  off, the gate, relu2) would repeat phase A's labels, so they are not drawn."""
  archive, steps = tmp_path / "archive", _eval_steps(9375)
  drawn = [fmnist.run(attention="softmax"), fmnist.run(attention="relu", alpha=0.0, seed=1),
           fmnist.run(attention="relu", seed=fmnist.HELD_OUT_SEED),
           fmnist.run(attention="relu", epochs=10)]
  not_drawn = [fmnist.run(attention="relu", alpha=0.0, gated=True),
               fmnist.run(attention="relu", alpha=0.0, qk_norm=False),
               fmnist.run(attention="relu2", alpha=0.0)]
  for run in drawn + not_drawn:
    _archive_run(archive, run, dict.fromkeys(steps, 0.9), transfer=0.5)
  results = fmnist_results.load_results(archive)
  assert sum(bool(r.curve) for r in results) == len(drawn + not_drawn)
  assert ({r.run.run_id for r in fmnist_report.curve_runs(results)}
          == {run.run_id for run in drawn})


def test_the_runs_table_says_which_cpu_trained_each_part_of_a_run(tmp_path):
  """A run resumed on another machine says so (XLA:CPU's results differ at rounding level
  between CPU models; docs/reproduction.md 1.4). Starts recorded before launches named their
  CPU are '?', but for the last: the machine that finished the run (its provenance). Resumes on
  the CPU model of the start before them are folded into it."""
  archive, steps = tmp_path / "archive", _eval_steps(9375)
  expected = {"softmax": "AMD EPYC from 0", "relu": "? from 0, ? from 7032, Intel Xeon from 8095",
              "identity": "finished on AMD EPYC", "gelu": "AMD EPYC from 0, Intel Xeon from 5000"}
  for attention, launches, finished_on in (
      ("softmax", [{"resumes_from_step": 0}], "AMD EPYC"),
      ("identity", [], "AMD EPYC"),  # archived before launch records
      ("relu", [{"resumes_from_step": 0}, {"resumes_from_step": 7032},
                {"resumes_from_step": 8095, "cpu": "Intel(R) Xeon(R) Processor"}],
       "Intel(R) Xeon(R) Processor"),
      ("gelu", [{"resumes_from_step": step, "cpu": cpu} for step, cpu in (  # resumes, same CPU
          (0, "AMD EPYC"), (3000, "AMD EPYC"), (5000, "Intel(R) Xeon(R) Processor"),
          (7000, "Intel(R) Xeon(R) Processor"))], "Intel(R) Xeon(R) Processor")):
    run = fmnist.run(attention=attention)
    _archive_run(archive, run, dict.fromkeys(steps, 0.9), transfer=0.5)
    directory = archive_lib.archived_dir(archive, run)
    if launches:
      (directory / provenance.LAUNCHES_FILE).write_text(
          "".join(json.dumps(x) + "\n" for x in launches))
    (directory / provenance.PROVENANCE_FILE).write_text(
        json.dumps({"commit": "0123456789", "machine": {"cpu": finished_on}}))
  rows = fmnist_report.runs_table(fmnist_results.load_results(archive), {})
  for attention, trained_on in expected.items():
    run_id = fmnist.run(attention=attention).run_id
    row = next(line for line in rows if line.startswith(f"| {run_id} |"))
    assert row.endswith(f" | 0123456 | {trained_on} |"), row


def _calibration_archive(archive, softmax_20_epochs, other_lr=None):
  """The calibration runs: 10-epoch softmax 0.900 (flat last quarter), relu 0.880; 20 epochs:
  relu 0.885 and softmax `softmax_20_epochs`; with `other_lr` = (softmax accuracy, its last
  quarter's gain), the pair at 20 epochs and lr 2e-3 (relu 0.89)."""
  base = fmnist.BASE_LR
  runs = [(fmnist.run(attention="softmax", epochs=10, lr=base), 0.900, 1, 0.0),
          (fmnist.run(attention="relu", epochs=10, lr=base), 0.880, 1, 0.0),
          (fmnist.run(attention="relu", epochs=20, lr=base), 0.885, 2, 0.0),
          (fmnist.run(attention="softmax", epochs=20, lr=base), softmax_20_epochs, 2, 0.0)]
  if other_lr:
    runs += [(fmnist.run(attention="softmax", epochs=20, lr=2e-3), *other_lr[:1], 2, other_lr[1]),
             (fmnist.run(attention="relu", epochs=20, lr=2e-3), 0.89, 2, 0.0)]
  for run, final, length, late_gain in runs:
    steps = _eval_steps(math.ceil(10 * length * 60000 / 128))  # 4,688 or 9,375 steps
    curve = {s: final - 0.05 * (s <= steps[3]) - late_gain * (s < steps[-1]) for s in steps}
    _archive_run(archive, run, curve, transfer=0.5)


def _check_calibration(archive):
  return subprocess.run(
      [sys.executable, "-m", "big_vision_relu.experiments.studies.fmnist.report", "--archive",
       str(archive), "--check_calibration"], capture_output=True, text=True, timeout=300,
      check=False, cwd=ROOT)


@pytest.mark.parametrize("softmax_20_epochs, accepted", [(0.905, True), (0.915, False)])
def test_the_calibration_gate(tmp_path, softmax_20_epochs, accepted):
  """D1: the 20-epoch recipe is accepted only when (a)-(c) all hold (here (c) decides: 20 epochs
  gain 0.5 or 1.5 points; then D2 waits for its pair); the CLI says so by its exit code, and
  the study's gate (`recipe.gate`, which the study runner asks) opens only then."""
  archive = tmp_path / "archive"
  _calibration_archive(archive, softmax_20_epochs)
  rules = fmnist_recipe.calibration(fmnist_results.load_results(archive))
  assert (rules.a, rules.b, rules.c) == (True, True, accepted)
  assert rules.choice == ((20, fmnist.BASE_LR) if accepted else None)
  # The gate opens only when the choice is the study's recipe (with fmnist.LR = 2e-3, D1's
  # choice here would not be).
  gate_open = rules.choice == (fmnist.EPOCHS, fmnist.LR)
  assert rules.accepted == gate_open
  result = _check_calibration(archive)
  assert result.returncode == (0 if gate_open else fmnist_report.NOT_ACCEPTED_EXIT_CODE)
  assert ("- accepted: yes" in result.stdout) == gate_open, result.stdout + result.stderr
  gate = fmnist_recipe.gate(archive)
  assert (gate is None) == gate_open
  assert gate_open or gate[0] == fmnist.CALIBRATION_PHASES == (0, 1)
  assert accepted or "D2: waiting for the pair at 20 epochs, lr 0.002" in result.stdout


@pytest.mark.parametrize("other_lr, chosen", [
    ((0.925, 0.0), 2e-3),  # scores higher and is converged
    ((0.925, 0.006), 1e-3),  # scores higher but its last quarter adds 0.6 points: the other
    ((0.91, 0.0), 1e-3),  # scores lower
])
def test_rule_d2_picks_the_20_epoch_lr(tmp_path, monkeypatch, other_lr, chosen):
  """D2 (docs/reproduction.md 1.2): the lr whose 20-epoch softmax scores higher, if its last
  quarter meets (b), else the other; the gate opens only once the study's LR is the choice, and
  the calibration runs are then the other points'."""
  archive = tmp_path / "archive"
  _calibration_archive(archive, 0.915, other_lr)  # (c) fails: 1.5 points from 10 to 20 epochs
  rules = fmnist_recipe.calibration(fmnist_results.load_results(archive))
  assert rules.choice == (20, chosen)
  assert rules.reason.endswith("its softmax meets (a) and its last quarter meets (b)")
  assert rules.accepted == (chosen == fmnist.LR)
  if chosen != fmnist.LR:
    result = _check_calibration(archive)
    assert result.returncode == fmnist_report.NOT_ACCEPTED_EXIT_CODE
    assert f"the rules choose 20 epochs, lr {chosen:g}" in result.stdout
  _set_recipe_lr(monkeypatch, chosen)
  results = fmnist_results.load_results(archive)
  assert fmnist_recipe.calibration(results).accepted
  assert "- accepted: yes" in fmnist_recipe.calibration_lines(results)
  assert {(r.args["epochs"], r.args["lr"]) for r in fmnist.calibration()} == (
      set(fmnist.CALIBRATION) - {(20, chosen)})


def _write_idx(path, array):
  header = np.array([0x0800 + array.ndim, *array.shape], ">u4").tobytes()
  import gzip
  path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


@pytest.fixture
def fixture_data_dir(offline_data_dir, tmp_path):
  """A data dir with mnist5k and digits (linked) and a 64 + 32 image `fashion_mnist_local`
  built from IDX files the test writes (the runlocal study reads train[:64] and test[:32])."""
  data_dir, source = tmp_path / "tfds", tmp_path / "idx"
  data_dir.mkdir()
  source.mkdir()
  for name in ("mnist5k", "digits"):
    (data_dir / name).symlink_to(pathlib.Path(offline_data_dir) / name)
  rng = np.random.default_rng(0)
  for split, n in (("train", 64), ("test", 32)):
    images_file, labels_file = fashion_mnist.FILES[split]
    _write_idx(source / images_file, rng.integers(0, 256, (n, 28, 28)))
    _write_idx(source / labels_file, np.arange(n) % 10)
  builder = tfds.builder(fashion_mnist.NAME, data_dir=str(data_dir), source_dir=str(source),
                         source_sha256={})
  datasets.prepare(builder)
  return data_dir


def _git(*args):
  return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                        text=True).stdout.strip()


@pytest.mark.slow
def test_a_pinned_study_trains_from_its_worktree_and_records_the_commit(fixture_data_dir,
                                                                         tmp_path):
  root, archive = tmp_path / "root", tmp_path / "archive"
  head = _git("rev-parse", "HEAD")
  env = {**os.environ, "TFDS_DATA_DIR": str(fixture_data_dir), "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": FAST_COMPILE}

  def run_study(*args):
    return subprocess.run(
        [sys.executable, "-m", "big_vision_relu.experiments.study", "--plan", "fmnist",
         "--root", str(root), "--archive", str(archive), "--phases", "0",
         # patch 4 (later arguments win): what is tested is the pinning, not the length.
         "--config_args", "runlocal,patch=4", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
  try:
    done = run_study("--commit", "HEAD", "--max_runs", "1", "--workers", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _git("-C", str(root / "code"), "rev-parse", "HEAD") == head
    assert json.loads((archive / archive_lib.STUDY_FILE).read_text()) == {"plan": "fmnist",
                                                                     "commit": head}
    run = fmnist.run(attention="softmax")
    record = provenance.read_provenance(archive_lib.archived_dir(archive, run))
    assert record["commit"] == head
    assert record["machine"]["jax_backend"] == "cpu" and record["machine"]["cores"] > 0
    # The trainer ran the worktree's code, not this checkout's.
    log = (root / "runs" / run.run_id / "train.log").read_text()
    assert str(root / "code" / "big_vision_relu" / "train.py") in _traced_module(root, env)
    assert "Traceback" not in log
    # The archive pins the study: another commit is refused, with what to do.
    # `{head}~1`, not HEAD~1: a commit made while the test runs must not move what it asks for.
    if _git("rev-list", "--count", head) != "1":
      refused = run_study("--commit", f"{head}~1", "--max_runs", "0")
      assert refused.returncode != 0
      assert f"pins this study to plan 'fmnist' at commit {head}" in refused.stderr
  finally:
    subprocess.run(["git", "worktree", "remove", "--force", str(root / "code")], cwd=ROOT,
                   check=False, capture_output=True)


def _traced_module(root, env):
  """Where `big_vision_relu.train` resolves for a process started as the study starts trainers
  (cwd and PYTHONPATH the worktree)."""
  code = root / "code"
  return subprocess.run(
      [sys.executable, "-c", "import big_vision_relu.train as t; print(t.__file__)"],
      cwd=code, env={**env, "PYTHONPATH": str(code)}, capture_output=True, text=True,
      check=True).stdout
