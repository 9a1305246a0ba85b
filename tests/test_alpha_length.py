"""The alpha-length study (docs/alpha_length.md): its validation split, its grid and run order,
and its pre-registered estimator, decision rule and paired tests against independent
references (scipy, numpy polyfit over the exact parabola, hand-computed cases)."""
import hashlib
import json
import shutil

import numpy as np
import pytest
import scipy.stats

from big_vision_relu.data import holdout
from big_vision_relu.data import input_pipeline
from big_vision_relu.experiments import run_status, sweep
from big_vision_relu.experiments.studies import alpha_length
from big_vision_relu.experiments.studies.alpha_length import protocol as al

EVAL_PP = 'decode(channels=1)|value_range(-1, 1)|onehot(10)|keep("image", "labels")'


# ----------------------------------------------------------------------------- the holdout

def test_select_is_stratified_disjoint_and_fixed_by_its_seed():
  labels = np.random.default_rng(1).integers(0, 7, 1000)
  chosen = holdout.select(labels, 100, seed=3)
  assert len(chosen) == 100 and len(set(chosen.tolist())) == 100
  assert np.all(np.diff(chosen) > 0)
  counts, sizes = np.bincount(labels[chosen], minlength=7), np.bincount(labels, minlength=7)
  # Every class within one example of its proportional share, the total exact.
  assert np.all(np.abs(counts - 100 * sizes / 1000) < 1)
  np.testing.assert_array_equal(chosen, holdout.select(labels, 100, seed=3))
  assert not np.array_equal(chosen, holdout.select(labels, 100, seed=4))
  rest = holdout.records(labels, dict(num_examples=100, seed=3, part="rest"))
  np.testing.assert_array_equal(np.sort(np.concatenate([rest, chosen])), np.arange(1000))
  np.testing.assert_array_equal(
      holdout.records(labels, dict(num_examples=100, seed=3, part="held_out")), chosen)


def test_equal_classes_split_exactly():
  labels = np.repeat(np.arange(10), 600)  # Fashion-MNIST's balance, at a tenth of its size
  assert np.bincount(labels[holdout.select(labels, 500, seed=0)]).tolist() == [50] * 10
  assert holdout.part_size(6000, dict(num_examples=500, seed=0, part="rest")) == 5500


@pytest.mark.parametrize("spec,message", [
    (dict(num_examples=10, seed=0), "missing"),
    (dict(num_examples=10, seed=0, part="val"), "part"),
    (dict(num_examples=0, seed=0, part="rest"), "positive"),
    (dict(num_examples=10, seed=-1, part="rest"), "seed"),
    ([10, 0, "rest"], "must be dict"),
])
def test_bad_holdout_specs_say_what_to_set(spec, message):
  with pytest.raises(ValueError, match=message):
    holdout.check_spec("input.data.holdout", spec)


def test_a_holdout_as_large_as_its_split_is_refused():
  with pytest.raises(ValueError, match="smaller than the split"):
    holdout.part_size(100, dict(num_examples=100, seed=0, part="rest"))


def test_rest_examples_draw_a_stratified_nested_subset_of_the_rest():
  labels = np.repeat(np.arange(10), 600)[np.random.default_rng(2).permutation(6000)]
  spec = dict(num_examples=500, seed=0, part="rest")
  rest, held_out = (holdout.records(labels, dict(spec, part=part)) for part in holdout.PARTS)
  subsets = {n: holdout.records(labels, dict(spec, rest_examples=n)) for n in (750, 1500, 3000)}
  for n, subset in subsets.items():
    assert np.bincount(labels[subset]).tolist() == [n // 10] * 10  # stratified, exact
    assert np.all(np.diff(subset) > 0) and np.isin(subset, rest).all()  # in order, of the rest
    assert holdout.part_size(6000, dict(spec, rest_examples=n)) == n
  assert set(subsets[750]) < set(subsets[1500]) < set(subsets[3000])  # nested
  # Its own stream: not the held-out draw's permutation applied to the rest.
  same_stream = rest[holdout.select(labels[rest], 750, seed=0)]
  assert not np.array_equal(subsets[750], same_stream)
  np.testing.assert_array_equal(held_out, holdout.select(labels, 500, seed=0))  # unchanged


@pytest.mark.parametrize("spec,message", [
    (dict(num_examples=10, seed=0, part="rest", rest_examples=0), "positive int"),
    (dict(num_examples=10, seed=0, part="held_out", rest_examples=5), "the part 'rest' only"),
    (dict(num_examples=10, seed=0, part="rest", rest_extra=5), r"unknown keys: \['rest_extra'\]"),
])
def test_bad_rest_examples_say_what_to_set(spec, message):
  with pytest.raises(ValueError, match=message):
    holdout.check_spec("input.data.holdout", spec)


def test_rest_examples_as_large_as_the_rest_are_refused():
  with pytest.raises(ValueError, match=r"smaller than the rest it is drawn from \(90 examples"):
    holdout.part_size(100, dict(num_examples=10, seed=0, part="rest", rest_examples=90))


def _digest(image):
  return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()


def test_the_pipeline_reads_the_parts_the_selection_names(offline_data_dir):
  """Eval batches of the held-out part are the whole split's records at `holdout.select`'s
  numbers (read independently, in order); one epoch of training batches over the rest is
  every other record once."""
  whole = dict(name="mnist5k", split="train", data_dir=offline_data_dir)
  spec = dict(num_examples=400, seed=5)
  batches = list(input_pipeline.eval_batches(whole, EVAL_PP, 500, process_index=0,
                                             process_count=1))
  images = np.concatenate([b["image"][b["_mask"]] for b in batches])
  labels = np.concatenate([b["labels"][b["_mask"]] for b in batches]).argmax(-1)
  numbers = holdout.select(labels, **spec)
  held_out = dict(whole, holdout=dict(spec, part="held_out"))
  got = list(input_pipeline.eval_batches(held_out, EVAL_PP, 500, process_index=0,
                                         process_count=1))
  np.testing.assert_array_equal(np.concatenate([b["image"][b["_mask"]] for b in got]),
                                images[numbers])
  rest = dict(whole, holdout=dict(spec, part="rest"))
  stream = input_pipeline.training_batches(rest, EVAL_PP, 400, seed=0, process_index=0,
                                           process_count=1)
  try:
    seen = [_digest(x) for _ in range(9) for x in next(stream)["image"]]  # 3,600 = one epoch
  finally:
    stream.close()
  expected = [_digest(x) for i, x in enumerate(images) if i not in set(numbers.tolist())]
  assert sorted(seen) == sorted(expected)
  # rest_examples: one epoch is the subset `holdout.records` names, each once.
  subset = dict(spec, part="rest", rest_examples=800)
  stream = input_pipeline.training_batches(dict(whole, holdout=subset), EVAL_PP, 400, seed=0,
                                           process_index=0, process_count=1)
  try:
    seen = [_digest(x) for _ in range(2) for x in next(stream)["image"]]
  finally:
    stream.close()
  assert sorted(seen) == sorted(_digest(images[i]) for i in holdout.records(labels, subset))


# ----------------------------------------------------------------------------- grid and order

def test_the_grid_and_its_order():
  planned = alpha_length.PLAN.runs()
  assert len(planned) == 3 * (2 * 9 + 7)  # 16 and 49: 7 alphas + 2 controls; 196: 5 + 2
  first = planned[:9]
  assert {p.run.args["patch"] for p in first} == {7} and {p.run.args["seed"] for p in first} == {0}
  assert [p.run.args["patch"] for p in planned] == sorted(
      (p.run.args["patch"] for p in planned), reverse=True)  # L = 16, then 49, then 196
  for item in planned:
    config = sweep.load_config(item.run)
    assert config.input.data.holdout.to_dict() == dict(num_examples=5000, seed=0, part="rest")
    assert config.evals.val.data.holdout.part == "held_out"
    assert config.total_epochs == 40
    # The study's total steps are known without the data (study.check_totals_known).
    assert run_status.total_steps(config.to_dict()) == -(-40 * 55_000 // 128)


# ----------------------------------------------------------------------------- the rule

def test_run_result_selects_on_validation_only():
  rows = [{"step": 1, "val/prec@1": 0.5, "test/prec@1": 0.9},
          {"step": 10, "val/prec@1": 0.8, "test/prec@1": 0.7},
          {"step": 15, "training_loss": 0.1},
          {"step": 20, "val/prec@1": 0.8, "test/prec@1": 0.6}]
  result = al.run_result(rows)
  assert (result.val_best, result.step_best, result.test_at_best) == (0.8, 10, 0.7)
  assert (result.test_final, result.val_final, result.evaluations) == (0.6, 0.8, 3)


def test_alpha_star_is_the_parabolas_vertex():
  alphas = (0.0, 0.5, 1.0, 1.5, 2.0)
  truth = lambda a: 0.9 - 0.02 * (a - 1.3) ** 2  # noqa: E731
  star = al.alpha_star(alphas, [truth(a) for a in alphas])
  assert star.alpha == pytest.approx(1.3) and not star.censored
  # Unevenly spaced points: the vertex of numpy's exact parabola through the three.
  alphas = (0.0, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
  y = [0.80, 0.85, 0.88, 0.89, 0.885, 0.87, 0.86]
  c2, c1, _ = np.polyfit([0.75, 1.0, 1.25], [0.88, 0.89, 0.885], 2)
  assert al.alpha_star(alphas, y).alpha == pytest.approx(-c1 / (2 * c2))
  assert al.alpha_star(alphas, sorted(y)) == al.AlphaStar(2.0, censored=True)


def test_slopes_of_the_two_hypotheses():
  lengths = (16, 49, 196)
  assert al.slope(lengths, (1.0, 1.0, 1.0)) == pytest.approx(0.0)
  ols = scipy.stats.linregress(np.log(lengths), (1.4, 1.0, 0.74)).slope
  assert al.slope(lengths, (1.4, 1.0, 0.74)) == pytest.approx(ols)
  # H0's curve K / ln L through alpha* = 1 at L = 49: its slope, and the predictions the
  # protocol quotes (1.40 at L = 16, 0.74 at L = 196).
  k = np.log(49)
  assert k / np.log(16) == pytest.approx(1.40, abs=0.005)
  assert k / np.log(196) == pytest.approx(0.74, abs=0.005)
  exact = scipy.stats.linregress(np.log(lengths), k / np.log(lengths)).slope
  assert al.h0_slope(lengths, k / np.log(lengths)) == pytest.approx(exact)


def _accuracies(stars, noise, seeds=3, seed=0):
  rng = np.random.default_rng(seed)
  return {n: {a: list(0.9 - 0.03 * (a - s) ** 2 + noise * rng.standard_normal(seeds))
              for a in al.ALPHAS[n]} for n, s in stars.items()}


def test_the_rule_can_return_each_verdict():
  h1 = al.decide(_accuracies({16: 1.0, 49: 1.0, 196: 1.0}, 1e-5), samples=200)
  assert h1.verdict == "supports H1", h1
  k = np.log(49)  # H0 exactly: alpha* = K / ln L
  h0 = al.decide(_accuracies({n: k / np.log(n) for n in (16, 49, 196)}, 1e-5), samples=200)
  assert h0.verdict == "supports H0", h0
  # Precise data that follow neither hypothesis (alpha* rising with L): both are excluded.
  neither = al.decide(_accuracies({16: 0.8, 49: 1.0, 196: 1.3}, 1e-5), samples=200)
  assert neither.verdict == "inconclusive" and "neither" in neither.reason
  noisy = al.decide(_accuracies({16: 1.2, 49: 1.0}, 0.05), samples=200)
  assert noisy.verdict == "inconclusive"
  edge = al.decide(_accuracies({16: 3.0, 49: 1.0}, 1e-5), samples=50)
  assert edge.verdict == "inconclusive" and "grid end" in edge.reason


def test_paired_test_against_scipy():
  a, b = [0.905, 0.899, 0.902], [0.901, 0.900, 0.895]
  got = al.paired_test(a, b)
  d = np.subtract(a, b)
  t = scipy.stats.t.ppf(0.95, len(d) - 1)
  se = scipy.stats.sem(d)
  assert got.mean == pytest.approx(d.mean()) and got.se == pytest.approx(se)
  assert got.lower == pytest.approx(d.mean() - t * se, abs=1e-6)
  assert got.non_inferior and not got.superior
  assert got.equivalent == (got.upper < al.MARGIN)
  for df, quantile in al.T_95.items():
    assert quantile == pytest.approx(scipy.stats.t.ppf(0.95, df), abs=1e-4)
  assert not al.paired_test([0.88, 0.87, 0.875], [0.90, 0.90, 0.90]).non_inferior


# ----------------------------------------------------------------------------- the report

def _write_run(archive, run, val, test):
  """An archived run whose val/test curves peak at `val`/`test` at step 100, then fall; its
  attention statistics are 0.5 (row sums) and 0.25 (branch / residual) at every layer."""
  path = archive / "runs" / run.run_id
  path.mkdir(parents=True)
  layer = {f"attention/layer{i}/{k}": value for i in range(4)
           for k, value in (("row_sum_mean", 0.5), ("attention_to_residual", 0.25))}
  rows = [dict(step=1, **{"val/prec@1": 0.1, "test/prec@1": 0.1}, **layer),
          dict(step=100, **{"val/prec@1": val, "test/prec@1": test}),
          dict(step=200, **{"val/prec@1": val - 0.01, "test/prec@1": test - 0.02,
                            "core_hours": 0.5}, **layer)]
  (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_the_report_redraws_the_interim_verdict_from_an_archive(tmp_path):
  from big_vision_relu.experiments.studies.alpha_length import report
  rng = np.random.default_rng(0)

  def archive_length(patch, best_alpha):
    for run in al.runs(patch):
      a = run.args
      val = (0.9 - 0.03 * (a["alpha"] - best_alpha) ** 2 if a["attention"] == "relu"
             else 0.89 if a["attention"] == "softmax" else 0.85) + 1e-5 * rng.standard_normal()
      _write_run(tmp_path, run, val, val - 0.002)

  # One complete length: its alpha* (between grid points: 1.1 on 0.75, 1, 1.25, 1.5), no verdict.
  archive_length(7, best_alpha=1.1)
  text = report.write(tmp_path, tmp_path / "out").read_text()
  assert ("- L = 16: alpha* = 1.10; 5-95% over bootstrap resamples of its seeds [1.10, 1.10]"
          in text)
  assert "The verdict: not yet: complete grids at L = [16]" in text and "verdict (" not in text
  shutil.rmtree(tmp_path / "runs")
  for patch in (7, 4):  # two complete lengths: the interim verdict
    archive_length(patch, best_alpha=1.0)
  (tmp_path / "baselines").mkdir()
  (tmp_path / "baselines" / "p7.json").write_text(json.dumps({
      "val/pixel_1nn": 0.85, "test/pixel_1nn": 0.84, "val/pixel_ridge": 0.82,
      "test/pixel_ridge": 0.81, "fewshot/pixels/10shot_avg": 0.78,
      **{f"{split}/random_init/seed{seed}/{probe}": value + 0.02 * seed - 0.01 * (split == "test")
         for split in ("val", "test") for seed in (0, 1)
         for probe, value in (("1nn", 0.60), ("ridge", 0.70))},
      **{f"fewshot/random_init/seed{seed}/10shot_avg": 0.4 + 0.1 * seed for seed in (0, 1)},
      "fewshot/random_init/seed0/10shot_loo_avg": 0.9}))
  path = report.write(tmp_path, tmp_path / "out")
  text = path.read_text()
  assert ("- L = 16: pixel 1-NN val 0.8500, test 0.8400; pixel ridge val 0.8200, test 0.8100; "
          "the random network (seed mean) 1-NN val 0.6100, test 0.6000, ridge val 0.7100, test "
          "0.7000; 10-shot transfer: raw pixels 0.780, random init 0.450") in text
  assert "- L = 49: not computed" in text
  assert "54 of 75 runs archived, 27.0 core hours" in text
  assert "**interim verdict (16, 49): supports H1**" in text
  assert "L = 16: alpha* = 1.00" in text and "L = 196 (patch 2)" in text
  # relu/L (0.898 test) - softmax (0.888): +1.00 point on every seed: "better".
  assert "L = 49: +1.00 points" in text and ": better" in text
  assert (tmp_path / "out" / "accuracy_vs_alpha.png").stat().st_size > 10_000
  assert (tmp_path / "out" / "alpha_star.png").stat().st_size > 10_000
  assert (tmp_path / "out" / "mixing.png").stat().st_size > 10_000
  # The mixing figure: at each complete length, every cell but attention off at its row sum
  # (left, 0.5 here, softmax's too) and its branch / residual (right, 0.25), and its test
  # result minus attention off's, seed-paired.
  runs = report.collect(tmp_path)
  axes = report.plot_mixing(runs).axes
  assert len(axes) == 2
  containers = [(c, statistic) for ax, statistic in zip(axes, (0.5, 0.25)) for c in ax.containers]
  assert [c.get_label() for c, _ in containers] == ["L = 16", "L = 49"] * 2
  for (container, statistic), patch in zip(containers, (7, 4) * 2):
    x, y = container.lines[0].get_data()
    test = {r.run.run_id: r.result.test_at_best for r in runs}

    def minus_off(cell):
      return 100 * np.mean([test[al.GRID.run(**cell, seed=s).run_id]
                            - test[al.GRID.run(patch=patch, attention="zero", seed=s).run_id]
                            for s in al.SEEDS])
    expected = [minus_off(c) for c in al.cells(patch) if c["attention"] != "zero"]
    np.testing.assert_allclose(x, statistic)
    np.testing.assert_allclose(y, expected)
  # Section 5's reading of the verdict: the validation argmax (alpha 1 here) against attention
  # off, seed-paired on test. Attention off's test is 0.848 here, relu alpha 1's 0.898: better.
  assert ("- L = 16: relu alpha 1 - attention off +5.00 points, 90% [+5.00, +5.00]: better"
          in text)
  assert "At every complete length the best alpha is better than attention off." in text
  # Attention off as good as the argmax at L = 49 (differences -0.1, +0.2, -0.05 points):
  # not better there, and the verdict is marked as no evidence about the normaliser.
  for seed, offset in zip(al.SEEDS, (0.001, -0.002, 0.0005)):
    run = al.GRID.run(patch=4, attention="zero", seed=seed)
    shutil.rmtree(tmp_path / "runs" / run.run_id)
    _write_run(tmp_path, run, 0.9, 0.898 + offset)
  text = report.write(tmp_path, tmp_path / "out").read_text()
  assert "- L = 16: relu alpha 1 - attention off +5.00 points" in text
  assert "- L = 49: relu alpha 1 - attention off +0.02 points" in text
  assert ("At L = 49 the best alpha is not better than attention off (section 5: it wins by "
          "switching attention off): the verdict is not evidence about the normaliser there."
          in text)


def test_the_report_reads_alpha_star_through_each_readout():
  """Each readout of a run (best and final val, test at the selected step and final) feeds
  alpha* on its own: parabolas in alpha with vertices 1.1, 0.6, 1.4 and 2.5 (past the grid's
  end: censored at 2) give exactly those alpha*s."""
  from big_vision_relu.experiments.studies.alpha_length import report
  vertex = {"val_best": 1.1, "val_final": 0.6, "test_at_best": 1.4, "test_final": 2.5}
  runs = [report.Archived(
      run, al.RunResult(step_best=100, evaluations=21, **{
          name: 0.9 - 0.03 * (run.args["alpha"] - v) ** 2 for name, v in vertex.items()}),
      first={}, last={}, core_hours=0.0)
          for run in al.runs(7) if run.args["attention"] == "relu"]
  assert report.readout_lines(runs) == [
      "## alpha* through other readouts of the same runs (description, not the rule)", "",
      "| readout | alpha*(16) |", "|---|---|",
      "| best val (the rule) | 1.10 |", "| final val | 0.60 |",
      "| test at the selected step | 1.40 |", "| final test | 2.00 (censored) |", ""]
  assert report.readout_lines(runs[:-1]) == []  # no complete length


def test_the_report_draws_the_final_verdict_from_all_three_lengths(tmp_path):
  """75 archived runs whose best alpha is H0's (ln 49 / ln L: 1.40, 1, 0.74): L = 196's coarser
  grid (0, 0.5, 1, 1.5, 2) places its alpha* between grid points, and the three lengths give the
  final verdict, H0's. Drawn before any L = 196 run is archived, so the report that will read
  them has run once on their shape."""
  from big_vision_relu.experiments.studies.alpha_length import report
  rng = np.random.default_rng(0)
  for patch, length in al.PATCH_TO_LENGTH.items():
    best_alpha = np.log(49) / np.log(length)
    for run in al.runs(patch):
      a = run.args
      val = (0.9 - 0.03 * (a["alpha"] - best_alpha) ** 2 if a["attention"] == "relu"
             else 0.89 if a["attention"] == "softmax" else 0.85) + 1e-4 * rng.standard_normal()
      _write_run(tmp_path, run, val, val - 0.002)
  text = report.write(tmp_path, tmp_path / "out").read_text()
  assert "75 of 75 runs archived, 37.5 core hours" in text
  table = text.split("### L = 196 (patch 2)")[1].split("##")[0]
  assert [line.split(" |")[0] for line in table.splitlines() if line.startswith("| relu")] == [
      "| relu a0", "| relu a0.5", "| relu a1", "| relu a1.5", "| relu a2"]
  assert "- L = 16: alpha* = 1.40;" in text and "- L = 196: alpha* = 0.74;" in text
  assert "| best val (the rule) | 1.40 | 1.00 | 0.74 |" in text
  assert "**final verdict (16, 49, 196): supports H0**" in text


def test_the_report_says_which_cpu_model_trained_each_run(tmp_path):
  """From each archived run's launches.jsonl: per length and seed, the runs grouped by the CPU
  models that trained them, and the relu/L - softmax pairs that crossed models."""
  from big_vision_relu.experiments.studies.alpha_length import report
  for run in al.runs(7):
    _write_run(tmp_path, run, 0.9, 0.9)
    cell, seed = run.args["attention"], run.args["seed"]
    amd = seed == 2 or (seed == 1 and cell == "relu" and run.args["alpha"] >= 1)
    starts = [{"resumes_from_step": 0, "cpu": "AMD EPYC" if amd else "Intel(R) Xeon(R) Processor"}]
    if seed == 1 and cell == "relu" and run.args["alpha"] == 0:
      starts.append({"resumes_from_step": 4500, "cpu": "AMD EPYC"})
    (tmp_path / "runs" / run.run_id / "launches.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in starts))
  assert report.cpu_lines(report.collect(tmp_path)) == [
      "## Which CPU model trained each run (description)", "",
      "- L = 16, seed 0: Intel Xeon from 0 (all 9 cells)",
      "- L = 16, seed 1: Intel Xeon from 0 (softmax, zero, relu a0.5, relu a0.75); Intel Xeon "
      "from 0, AMD EPYC from 4500 (relu a0); AMD EPYC from 0 (relu a1, relu a1.25, relu a1.5, "
      "relu a2)",
      "- L = 16, seed 2: AMD EPYC from 0 (all 9 cells)", "",
      "relu/L (alpha 1) - softmax seed pairs trained on different CPU models: L = 16 seed 1.", ""]
