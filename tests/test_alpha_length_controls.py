"""The alpha-length study's control (a) (experiments/studies/alpha_length_controls.py;
docs/alpha_length.md 5 and 7): its runs differ from the grid's only in the regulariser, its
gate waits for the grid and opens only what section 7's rule allows, its choice and its report
follow the rule on synthetic archives."""
import json
import math
import shutil

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from big_vision_relu.data import pp as pp_lib
from big_vision_relu.experiments import plans, run_status, study
from big_vision_relu.experiments.studies import alpha_length_controls as controls
from big_vision_relu.experiments.studies.alpha_length import protocol as al
from conftest import load_config_module

CONFIG = load_config_module(al.CONFIG)


def _config(run):
  return CONFIG.get_config(run.config_arg.split(":", 1)[1]).to_dict()


def test_at_the_grids_values_a_control_run_is_the_grids_run():
  for attention in ("softmax", "relu"):
    ours, grids = (controls.GRID.run(attention=attention, seed=1),
                   al.GRID.run(patch=4, attention=attention, seed=1))
    assert ours.run_id == grids.run_id and _config(ours) == _config(grids)


@pytest.mark.parametrize("name", list(controls.CANDIDATES))
def test_a_candidate_changes_only_its_regulariser(name):
  args = controls.CANDIDATES[name]
  ours, grids = controls.candidate_runs()[list(controls.CANDIDATES).index(name)], \
      al.GRID.run(patch=4, attention="softmax", seed=0)
  ours_config, grids_config = _config(ours), _config(grids)
  assert ours_config.pop("wd") == args.get("wd", 1e-4) and grids_config.pop("wd") == 1e-4
  ours_pp, grids_pp = ours_config["input"].pop("pp"), grids_config["input"].pop("pp")
  crop = f"inception_crop(28, area_min={args['crop']})|" if "crop" in args else ""
  assert ours_pp == grids_pp.replace("flip_lr|", crop + "flip_lr|")
  assert ours_config == grids_config


@pytest.mark.parametrize("images", controls.SIZES)
def test_a_size_run_changes_only_its_training_images(images):
  runs = [r for r in controls.size_runs() if r.args["train_images"] == images]
  assert [(r.args["attention"], r.args["seed"]) for r in runs] == [
      (a, s) for a in ("softmax", "relu") for s in al.SEEDS]
  for run in runs:
    grids = al.GRID.run(patch=4, attention=run.args["attention"], seed=run.args["seed"])
    assert run.run_id == grids.run_id.replace("-seed", f"-train{images}-seed")
    ours_config, grids_config = _config(run), _config(grids)
    assert ours_config["input"]["data"]["holdout"].pop("rest_examples") == images
    assert ours_config == grids_config  # epochs, not steps: the steps follow from the images
    assert run_status.total_steps(_config(run)) == -(-40 * images // 128)


def test_train_images_needs_a_validation_split_and_a_count():
  with pytest.raises(ValueError, match="set validation too"):
    CONFIG.get_config("train_images=7500")
  with pytest.raises(ValueError, match="a number of images, or 0 for all"):
    CONFIG.get_config("validation=5000,train_images=-1")


def test_the_crop_pp_crops_and_resizes_back_and_bad_crops_are_refused():
  image = np.random.default_rng(0).integers(0, 256, (28, 28, 1), dtype=np.uint8)
  pp = CONFIG.get_config("crop=50").input.pp
  fn = pp_lib.get_preprocess_fn(pp)
  outs = [fn({"image": tf.io.encode_png(image), "label": tf.constant(3, tf.int64),
              pp_lib.RNG_KEY: tf.constant([seed, 7], tf.int64)})["image"].numpy()
          for seed in range(4)]
  assert all(o.shape == (28, 28, 1) for o in outs)
  assert len({o.tobytes() for o in outs}) == 4  # random boxes (and flips) per example
  for bad in ("crop=100", "crop=-5"):
    with pytest.raises(ValueError, match="crop=.*0 for no crop"):
      CONFIG.get_config(bad)


def _write(archive, run, val_losses, *, diverged=False):
  """An archived run with val/loss at successive evaluations and a test/val accuracy."""
  path = archive / "runs" / run.run_id
  path.mkdir(parents=True)
  rows = [{"step": 100 * (i + 1), "val/loss": loss, "val/prec@1": 0.9 - loss / 10,
           "test/prec@1": 0.9 - loss / 10} for i, loss in enumerate(val_losses)]
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  if diverged:
    (path / "DIVERGED").write_text("loss nan\n")


RISING = (0.40, 0.30, 0.28, 0.31)  # rises 0.03 after its minimum
FLAT = (0.40, 0.30, 0.285, 0.29)  # 0.005


def _write_grid(tmp_path, softmax_curve):
  """The grid at L = 49, archived; its softmax seed-0 run's val/loss follows `softmax_curve`."""
  for run in al.runs(4):
    if run.run_id != controls.grid_softmax_run().run_id:
      _write(tmp_path / "alpha_length", run, FLAT)
  _write(tmp_path / "alpha_length", controls.grid_softmax_run(), softmax_curve)


def test_the_gate_waits_for_the_grid_and_is_moot_when_the_grid_does_not_overfit(tmp_path):
  archive = tmp_path / "alpha_length_controls"
  grid_run = tmp_path / "alpha_length" / "runs" / controls.grid_softmax_run().run_id
  for run in al.runs(4)[:-1]:
    _write(tmp_path / "alpha_length", run, RISING)
  assert controls.gate(archive) == ((), "waiting for the grid at L = 49: 1 of 27 runs not "
                                    f"archived in {tmp_path / 'alpha_length'}")
  # `--status` says it too (a plan without a gate: every phase).
  assert study.gate_line(controls.PLAN, archive) == (
      "gate: phases none may train now (waiting for the grid at L = 49: 1 of 27 runs not "
      f"archived in {tmp_path / 'alpha_length'})")
  assert study.gate_line(plans.load("repro"), archive) == "gate: every phase may train"
  _write(tmp_path / "alpha_length", al.runs(4)[-1], RISING)
  assert controls.gate(archive)[0] == (0,)
  assert study.gate_line(controls.PLAN, archive) == (
      "gate: phases 0 may train now (choosing the regulariser (phase 0))")
  for run in al.runs(4):
    (tmp_path / "alpha_length" / "runs" / run.run_id / "metrics.jsonl").unlink()
    (tmp_path / "alpha_length" / "runs" / run.run_id).rmdir()
  _write_grid(tmp_path, FLAT)
  phases, reason = controls.gate(archive)  # control (a) moot: control (b) opens at once
  assert phases == (controls.SIZES_PHASE,) and reason.startswith(
      "control (a) moot: the grid's L = 49 softmax val loss rises 0.0050")
  assert controls.PLAN.phases[controls.SIZES_PHASE][0] == "sizes"
  (grid_run / "metrics.jsonl").unlink()
  grid_run.rmdir()
  _write(tmp_path / "alpha_length", controls.grid_softmax_run(), RISING)  # the others: flat
  assert controls.gate(archive) == ((0,), "choosing the regulariser (phase 0)")
  plan = plans.load("alpha_length_controls")
  assert study.phases_to_train(plan, archive, None) == [0]
  assert [i.run.run_id for i in plan.runs([plan.phases[0]])] == \
      [r.run_id for r in controls.candidate_runs()]


@pytest.mark.parametrize("curves, chosen, meets, decided_after", [
    ((RISING, FLAT, FLAT, FLAT), "R2", True, 2),  # the first that meets, in R1-R4 order
    ((FLAT, FLAT, RISING, FLAT), "R1", True, 1),  # R2-R4 cannot change it: chosen at once
    ((RISING, (0.4, 0.3, 0.32), RISING, (0.4, 0.3, 0.315)), "R4", False, 4),  # smallest rise
])
def test_the_choice_opens_the_chosen_candidates_phase(tmp_path, curves, chosen, meets,
                                                      decided_after):
  archive = tmp_path / "alpha_length_controls"
  _write_grid(tmp_path, RISING)
  phase = 1 + list(controls.CANDIDATES).index(chosen)
  # Candidates archived one by one, in R1-R4 order: no choice until the archived ones decide
  # it, and then the one all four give.
  for archived, (run, curve) in enumerate(zip(controls.candidate_runs(), curves, strict=True)):
    _write(archive, run, curve)
    choice = controls.choose(controls.candidate_rises(archive))
    if archived + 1 < decided_after:
      assert choice.name is None
      assert controls.gate(archive) == ((0,), "choosing the regulariser (phase 0)")
    else:
      assert (choice.name, choice.meets) == (chosen, meets)
      # Its comparison first; the candidates still unarchived only take idle workers.
      assert controls.gate(archive) == ((phase, 0), f"{chosen} chosen; the candidates left "
                                        "take idle workers")
  assert controls.PLAN.phases[phase][0] == chosen
  # A later candidate archived out of order does not decide before an earlier one.
  shutil.rmtree(archive / "runs" / controls.candidate_runs()[0].run_id)
  assert controls.choose(controls.candidate_rises(archive)).name is None
  _write(archive, controls.candidate_runs()[0], curves[0])
  # Control (b) opens once the chosen comparison is archived (a diverged run counts).
  remaining = [r for r in controls.comparison_runs(chosen)
               if not (archive / "runs" / r.run_id).exists()]
  assert len(remaining) == 5
  for run in remaining[:-1]:
    _write(archive, run, FLAT)
  assert controls.gate(archive)[0] == (phase, 0)
  _write(archive, remaining[-1], (math.nan,), diverged=True)
  assert controls.gate(archive) == ((0, phase, controls.SIZES_PHASE),
                                    f"{chosen} chosen, control (a) archived; control (b) "
                                    "(phase 5)")


def test_a_diverged_candidate_never_meets_and_rises_most(tmp_path):
  archive = tmp_path / "a"
  for run in controls.candidate_runs():
    _write(archive, run, RISING, diverged=run.args.get("crop") == 50 and run.args["wd"] == 1e-4)
  rises = controls.candidate_rises(archive)
  assert math.isinf(rises["R3"].rise) and not rises["R3"].meets
  assert controls.choose(rises).name == "R1"  # 0.03 each; the first of the smallest


def test_the_report_says_whether_the_grids_verdict_survives(tmp_path):
  archive = tmp_path / "alpha_length_controls"
  grid = tmp_path / "alpha_length"
  for seed in al.SEEDS:  # grid: relu/L 0.3 points over softmax on every seed
    base = 0.30 + 0.001 * seed
    _write(grid, al.GRID.run(patch=4, attention="softmax", seed=seed), (0.4, base, base + 0.03))
    _write(grid, al.GRID.run(patch=4, attention="relu", seed=seed), (0.4, base - 0.03, base))
  for run in controls.candidate_runs():
    _write(archive, run, RISING if run.args["wd"] == 3e-4 and "crop" not in run.run_id else FLAT)
  text = controls.write(archive, tmp_path / "out").read_text()
  assert "The choice: **R2**" in text
  assert "| R1 | wd=0.0003 | 0.2800 | 0.3100 | +0.0300 | no |" in text
  assert "under R2: not all of its 6 runs archived" in text
  for seed in (1, 2):  # under R2: equal on every seed, within the margin
    _write(archive, controls.GRID.run(attention="softmax", seed=seed, wd=1e-3), FLAT)
  for seed in al.SEEDS:
    _write(archive, controls.GRID.run(attention="relu", seed=seed, wd=1e-3), FLAT)
  text = controls.write(archive, tmp_path / "out").read_text()
  assert "- the grid (weight decay 0.0001, no crop): +0.30 points" in text
  assert "**The grid's verdict (better) does not survive regularisation** (under R2: " \
         "equivalent)." in text
  # Each arm, by hand: the grid's softmax seed s tests 0.87 - 0.0001 s, its relu 0.873 -
  # 0.0001 s, every R2 run 0.8715; rises 0.03 (the grid) and 0.005 (R2's FLAT).
  assert "| softmax | 86.99 | 87.15 | +0.16 (0.01) | +0.0300 | +0.0050 |" in text
  assert "| relu/L (alpha 1) | 87.29 | 87.15 | -0.14 (0.01) | +0.0300 | +0.0050 |" in text


def test_the_parallel_rule_against_scipy():
  """Per seed the least-squares slope on log2(images) (scipy.stats.linregress), then the
  seeds' mean slope with the t interval of 2 degrees of freedom (scipy.stats.t)."""
  sizes = (7_500, 15_000, 30_000, 55_000)
  rng = np.random.default_rng(0)
  softmax = 0.85 + 0.01 * np.log2(np.array(sizes) / 7500) + rng.normal(0, 0.002, (3, 4))
  for slope, parallel in ((0.0, True), (0.009, False)):
    relu = softmax + 0.003 + slope * np.log2(np.array(sizes)) + rng.normal(0, 0.0005, (3, 4))
    test = controls.parallel_test(sizes, relu.tolist(), softmax.tolist())
    slopes = [scipy.stats.linregress(np.log2(sizes), r - s).slope
              for r, s in zip(relu, softmax, strict=True)]
    half = scipy.stats.t.ppf(0.95, 2) * scipy.stats.sem(slopes)
    assert test.mean == pytest.approx(np.mean(slopes), abs=1e-12)
    assert (test.lower, test.upper) == pytest.approx(
        (np.mean(slopes) - half, np.mean(slopes) + half), abs=1e-6)
    assert test.equivalent == parallel
    assert (test.lower > 0) == (not parallel)  # the steep one: relu/L's lead grows


def test_the_parallel_rules_size_at_its_margin_and_power_at_zero():
  # At the margin the rule errs ~5% of the time (each one-sided test at 5%), whatever the noise.
  for noise in (0.002, 0.005):
    assert controls.parallel_power(controls.PARALLEL_MARGIN, noise, trials=1000) == \
        pytest.approx(0.05, abs=0.025)
  assert controls.parallel_power(0.0, 0.0005, trials=200) == 1.0
  assert controls.parallel_power(2 * controls.PARALLEL_MARGIN, 0.002, trials=200) == 0.0


def test_the_report_draws_control_b_from_both_archives(tmp_path):
  """relu/L - softmax = 0.2 points + 0.1 per doubling on every seed: parallel, and growing."""
  archive, grid = tmp_path / "alpha_length_controls", tmp_path / "alpha_length"

  def write_size(run, images, attention):
    lead = 0.002 + 0.001 * np.log2(images / 7_500) if attention == "relu" else 0.0
    accuracy = 0.85 + 0.01 * np.log2(images / 7_500) + 0.0001 * run.args["seed"] + lead
    path = archive / "runs" / run.run_id if images < 55_000 else grid / "runs" / run.run_id
    path.mkdir(parents=True, exist_ok=True)
    rise = 0.05 + 0.001 * run.args["seed"] if attention == "softmax" else 0.01
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 50, "val/loss": 0.3, "val/prec@1": 0.4, "test/prec@1": 0.1, "core_hours": 0.1},
        {"step": 100, "val/loss": 0.3 + rise, "val/prec@1": 0.5, "test/prec@1": accuracy,
         "core_hours": 0.5})))

  for seed in al.SEEDS:
    for attention in ("softmax", "relu"):
      write_size(al.GRID.run(patch=4, attention=attention, seed=seed), 55_000, attention)
  for run in controls.size_runs()[:-1]:
    write_size(run, run.args["train_images"], run.args["attention"])
  text = controls.write(archive, tmp_path / "out").read_text()
  assert "| 30,000 | 5 of 6 |" in text and "The slope: not yet" in text
  # Each run's last core_hours, this plan's archive only (the grid's 6 runs are the grid's).
  assert "The controls' compute: 17 archived runs, 8.5 core hours" in text
  # The validation loss's rises: softmax's seed mean 0.05 + 0.001, relu/L's 0.01, read from the
  # curves (the run is selected at its last, highest-val/prec@1 step).
  assert "| 7,500 | 6 of 6 | 85.01 | 85.21 | +0.20 (0.00) | +0.0510 | +0.0100 |" in text
  assert "| 55,000 | 6 of 6 | 87.88 | 88.37 | +0.49 (0.00) | +0.0510 | +0.0100 |" in text
  partial, = (line for line in text.splitlines() if line.startswith("| 30,000 | 5 of 6 |"))
  assert partial.endswith("| +0.40 (0.00) | +0.0510 | +0.0100 |")  # relu/L: seeds 0-1
  run = controls.size_runs()[-1]
  (archive / "runs" / run.run_id).mkdir()
  (archive / "runs" / run.run_id / "DIVERGED").write_text("loss nan\n")
  assert (f"The slope: none, so **not shown parallel**: {run.run_id} diverged."
          in controls.write(archive, tmp_path / "out").read_text())
  (archive / "runs" / run.run_id / "DIVERGED").unlink()
  write_size(run, run.args["train_images"], run.args["attention"])
  text = controls.write(archive, tmp_path / "out").read_text()
  assert ("The slope of relu/L - softmax on log2(images): +0.10 points per doubling (SE 0.00; "
          "90% [+0.10, +0.10]): **parallel** (the rule: inside +-0.5 points per doubling); "
          "relu/L's lead grows with the images.") in text
  # The trivial baselines beside each size, from this plan's archive (n<images>.json) and, at
  # 55,000, the grid's (p4.json): the random networks' probes are their seed means.
  for where, name, pixel in ((archive, "n7500.json", 0.79), (grid, "p4.json", 0.85)):
    (where / "baselines").mkdir()
    (where / "baselines" / name).write_text(json.dumps({
        "test/pixel_1nn": pixel, "test/pixel_ridge": pixel - 0.01, "val/pixel_1nn": 0.5,
        **{f"test/random_init/seed{seed}/{probe}": value + 0.02 * seed
           for seed in al.SEEDS for probe, value in (("1nn", 0.54), ("ridge", 0.60))}}))
  text = controls.write(archive, tmp_path / "out").read_text()
  assert "| 7,500 | 79.00 | 78.00 | 56.00 | 62.00 |" in text
  assert "| 15,000 | not computed | not computed | not computed | not computed |" in text
  assert "| 55,000 | 85.00 | 84.00 | 56.00 | 62.00 |" in text
  # The figure draws what the rule reads: relu/L - softmax per seed and its mean, at all four
  # sizes, and each arm's seed means.
  assert (tmp_path / "out" / "sizes.png").stat().st_size > 10_000
  accuracy, lead = controls.plot_sizes(controls.size_curves(archive)).axes
  sizes = [7_500, 15_000, 30_000, 55_000]
  expected_lead = [0.2 + 0.1 * np.log2(n / 7_500) for n in sizes]
  assert len(lead.lines) == 4 + 1  # three seeds, the mean, the zero line
  for line in lead.lines[:4]:
    np.testing.assert_allclose(line.get_xdata(), sizes)
    np.testing.assert_allclose(line.get_ydata(), expected_lead, atol=1e-9)
  softmax, relu = (np.asarray(c.lines[0].get_ydata(), float) for c in accuracy.containers)
  np.testing.assert_allclose(softmax, [85.01 + np.log2(n / 7_500) for n in sizes], atol=1e-9)
  np.testing.assert_allclose(relu - softmax, expected_lead, atol=1e-9)
