"""`big_vision_relu.experiments.compare`: differences between seed groups in standard errors
(checked against scipy's Welch t statistic), paired differences, and clear errors for selections
that do not pick one group; the CLI on the reproduction's committed archive."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT
from scipy import stats

from big_vision_relu.experiments import compare, run_status

ACC = "test/prec@1"


def _row(seed: int, accuracy: float, *, status: str = "finished", **args) -> run_status.Row:
  args = {"attention": "relu", "alpha": 1.0, "qk_norm": True, **args, "seed": seed}
  return run_status.Row(f"run-{sorted(args.items())}", "mnist_vit", args, status,
                        metrics={ACC: accuracy})


RELU = [_row(0, 0.80), _row(1, 0.84), _row(2, 0.75)]
SOFTMAX = [_row(s, acc, attention="softmax") for s, acc in enumerate((0.91, 0.90, 0.88))]


def test_difference_in_standard_errors_is_welchs_t():
  a, b = [0.80, 0.84, 0.75], [0.91, 0.90, 0.88, 0.86]
  d = compare.difference(a, b)
  assert d.diff == pytest.approx(np.mean(a) - np.mean(b), abs=1e-15)
  assert d.se == pytest.approx(np.sqrt(np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 4), 1e-12)
  assert d.in_se == pytest.approx(stats.ttest_ind(a, b, equal_var=False).statistic, 1e-12)
  single = compare.difference([0.8], b)
  assert single.se is None and single.in_se is None and single.a.n == 1


def test_compare_selects_finished_seed_groups():
  running = _row(3, 0.10, status="running")
  rows = [*RELU, running, *SOFTMAX]
  d = compare.compare(rows, {"attention": "relu", "alpha": "1"}, {"attention": "softmax"}, ACC)
  assert (d.a.n, d.b.n) == (3, 3)  # the running seed is left out
  assert d.diff == pytest.approx(np.mean([0.80, 0.84, 0.75]) - np.mean([0.91, 0.90, 0.88]))
  assert compare.select(rows, {"qk_norm": "true", "attention": "relu"}) == RELU
  assert compare.select(rows, {"qk_norm": "False"}) == []


@pytest.mark.parametrize("a,message", [
    ({"atention": "relu"}, r"Unknown run arguments \['atention'\]"),
    ({"attention": "gelu"}, "no finished run matches"),
    ({"qk_norm": "yes"}, "not a boolean"),
    ({"alpha": "one"}, "not a number"),
    ({"qk_norm": "True"}, r"also differ in \['attention'\]"),
])
def test_selections_that_do_not_pick_one_group_fail_clearly(a, message):
  with pytest.raises(ValueError, match=message):
    compare.compare([*RELU, *SOFTMAX], a, {"attention": "softmax"}, ACC)


def test_paired_differences_by_alpha():
  rows = [_row(0, acc, alpha=alpha, qk_norm=qk_norm)
          for alpha, on, off in [(0.0, 0.80, 0.85), (0.5, 0.90, 0.88), (1.0, 0.70, 0.79)]
          for qk_norm, acc in [(True, on), (False, off)]]
  rows.append(_row(0, 0.5, alpha=2.0, qk_norm=False))  # no partner with qk-LN: left out
  pairs = compare.compare_paired(rows, {"qk_norm": "False"}, {"qk_norm": "True"}, ACC, "alpha")
  assert list(pairs) == [0.0, 0.5, 1.0]
  assert [round(d.diff, 6) for d in pairs.values()] == [0.05, -0.02, 0.09]
  assert compare.describe_paired(ACC, "alpha", pairs).endswith("mean +0.0400, 2 of 3 with its sign")
  with pytest.raises(ValueError, match="must not be selected"):
    compare.compare_paired(rows, {"alpha": "1"}, {"qk_norm": "True"}, ACC, "alpha")
  with pytest.raises(ValueError, match=r"Unknown run arguments \['alpha_'\]"):
    compare.compare_paired(rows, {"qk_norm": "False"}, {"qk_norm": "True"}, ACC, "alpha_")


def _final(run_id: str, metric: str) -> float:
  lines = (ROOT / "results/repro/runs" / run_id / "metrics.jsonl").read_text().splitlines()
  return json.loads(lines[-1])[metric]


def test_cli_on_the_committed_archive():
  """L = 196: relu/L against softmax over their 3 seeds, from the archive's final lines."""
  out = subprocess.run(
      [sys.executable, "-m", "big_vision_relu.experiments.compare",
       "--sweep", "configs/repro/fig2.py", "--root", "results/repro",
       "--a", "patch=2,attention=relu,alpha=1",
       "--b", "patch=2,attention=softmax"],
      cwd=ROOT, capture_output=True, text=True, check=True).stdout
  for metric in (ACC, "fewshot/10shot_avg"):
    relu, softmax = ([_final(f"mnist_vit-S-p2-{name}-a1-qk_norm-nogated-seed{s}", metric)
                      for s in range(3)] for name in ("relu", "softmax"))
    welch = stats.ttest_ind(relu, softmax, equal_var=False).statistic
    (line,) = [line for line in out.splitlines() if line.startswith(metric + ":")]
    assert re.search(rf"a - b {np.mean(relu) - np.mean(softmax):+.4f}, SE [0-9.]+, "
                     rf"{welch:+.1f} SE$", line), line
  bad = subprocess.run(
      [sys.executable, "-m", "big_vision_relu.experiments.compare",
       "--sweep", "configs/repro/fig2.py", "--root", "results/repro",
       "--a", "patch=2,attention=relu", "--b", "attention=softmax"],
      cwd=ROOT, capture_output=True, text=True, check=False)
  assert bad.returncode != 0 and "also differ in ['alpha'" in bad.stderr
  assert "Traceback" not in bad.stderr
