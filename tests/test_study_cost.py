"""What a study's phases cost and what is left (experiments/study_cost.py), on an archive of
the Fashion-MNIST study's own runs written here: spent core hours are the trainers' records,
what is left scales each run's FLOPs by the measured rate (forward_flops_per_image itself is
checked against an analytic count in test_configs.py)."""
import json

import pytest
from conftest import ROOT

from big_vision_relu.experiments import archive as archive_lib
from big_vision_relu.experiments import cost, parking, plans, run_status, study_cost
from big_vision_relu.experiments import sweep as sweep_lib
from big_vision_relu.experiments.studies.fmnist import protocol as fmnist

# Phase 0: softmax and relu/L at L = 196 (patch 2); phase 1: the same at L = 49 (patch 4, Ti).
PHASES = (("fig2", {"attention": ("softmax", "relu"), "alpha": 1.0, "seed": 0}),
          ("fig1", {"size": "Ti", "seed": 0}))


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
  monkeypatch.chdir(ROOT)  # sweep files name configs by repository-relative paths


def _pflops(run):
  """Training PFLOPs of a run: 3x the forward matmuls of every image of its 28x28x1 batches."""
  config = sweep_lib.load_config(run)
  steps = run_status.total_steps(json.loads(config.to_json()))
  return 3 * cost.forward_flops_per_image(dict(config.model), 28, 1, 10) * 128 * steps / 1e15


def _archive(archive, run, *, core_hours, diverged=False):
  """An archived run: its config, and a metrics line at its last step with its core hours."""
  directory = archive_lib.archived_dir(archive, run)
  directory.mkdir(parents=True)
  config = json.loads(sweep_lib.load_config(run).to_json())
  total = run_status.total_steps(config)
  (directory / "config.json").write_text(json.dumps(config))
  step = total // 3 if diverged else total
  (directory / "metrics.jsonl").write_text(json.dumps({"step": step, "core_hours": core_hours}))
  if diverged:
    (directory / run_status.DIVERGED_FILE).write_text("FloatingPointError")
  return total


def _costs(archive):
  return [study_cost.run_cost(archive, item, image_size=28, channels=1)
          for item in plans.plan(fmnist.SWEEPS, PHASES)]


def test_left_scales_each_run_by_the_rate_of_its_patch_size_and_its_parked_progress(tmp_path):
  archive = tmp_path / "archive"
  softmax, relu = (fmnist.run(attention=a, seed=0) for a in ("softmax", "relu"))
  softmax4, relu4 = (fmnist.run(attention=a, patch=4, seed=0) for a in ("softmax", "relu"))
  assert [item.run.run_id for item in plans.plan(fmnist.SWEEPS, PHASES)] == [
      r.run_id for r in (softmax, relu, softmax4, relu4)]
  for run in (softmax, relu, softmax4, relu4):  # Fashion-MNIST's shape, the run's batch and steps
    steps, flops = cost.training_steps_and_flops(sweep_lib.load_config(run), 28, 1)
    assert (steps, flops / 1e15) == (9375, pytest.approx(_pflops(run), rel=1e-12))
  # Nothing done: nothing to scale from.
  assert [study_cost.left(c, study_cost.core_hours_per_pflop(_costs(archive)))
          for c in _costs(archive)] == [None] * 4

  # softmax finished; relu/L parked a quarter of the way: L = 49 borrows L = 196's rate.
  total = _archive(archive, softmax, core_hours=3.3)
  (parking.parked_dir(archive, relu.run_id) / "checkpoints" / str(total // 4)).mkdir(
      parents=True)
  rate = 3.3 / _pflops(softmax)
  relu_left = (1 - (total // 4) / total) * rate * _pflops(relu)
  costs = _costs(archive)
  rates = study_cost.core_hours_per_pflop(costs)
  assert rates == {(2, 2): pytest.approx(rate), None: pytest.approx(rate)}
  assert [study_cost.left(c, rates) for c in costs] == pytest.approx(
      [0.0, relu_left, rate * _pflops(softmax4), rate * _pflops(relu4)])

  # An L = 49 run finishes: L = 49 uses its own rate; a diverged run's hours count as spent,
  # not in any rate.
  _archive(archive, softmax4, core_hours=0.9)
  _archive(archive, relu4, core_hours=0.2, diverged=True)
  costs = _costs(archive)
  rates = study_cost.core_hours_per_pflop(costs)
  assert rates[(4, 4)] == pytest.approx(0.9 / _pflops(softmax4))
  assert rates[None] == pytest.approx(4.2 / (_pflops(softmax) + _pflops(softmax4)))
  lines = study_cost.table(archive, fmnist.SWEEPS, PHASES, image_size=28, channels=1)
  assert lines[2] == (f"| 0 (fig2: attention=softmax/relu, alpha=1.0, seed=0) | 2 | 1 | 3.3 | "
                      f"{relu_left:.1f} |")
  assert lines[3] == "| 1 (fig1: size=Ti, seed=0) | 2 | 2 | 1.1 | 0.0 |"
  assert lines[4] == f"| **total** | 4 | 3 | 4.4 | {relu_left:.1f} |"
