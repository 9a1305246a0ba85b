"""`big_vision_relu.experiments.report` and its parts (run_status, stats, tables, figures):
metrics.jsonl replay (resumes), run status, CSV / Markdown tables and the figures' panels, from
workdirs fabricated for part of the paper's Figures 1 and 2 and for miniature
reproduction-style sweeps (a FigureSpec, seeds, the gate's cost)."""
from __future__ import annotations

import json
import pathlib
import statistics
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from conftest import ROOT

from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import figures, report, run_status, stats, sweep, tables

FIG1 = str(ROOT / "configs/paper/fig1.py")
FIG2 = str(ROOT / "configs/paper/fig2.py")
PAPER = sweep.PAPER_FIGURE
I21K_CONFIG = {"total_epochs": 30, "total_steps": None,
               "input": {"batch_size": 4096, "data": {"name": "imagenet21k",
                                                      "split": "full[51200:]"}}}
I21K_TOTAL = 103_608  # as in test_configs.py


def _steps(total: int) -> dict[str, Any]:
  return {"total_steps": total, "input": {"batch_size": 8, "data": {"name": "x", "split": "y"}}}


def _write_run(root: pathlib.Path, run: sweep.Run,
               lines: list[dict[str, Any]] | None, config: dict[str, Any] | None) -> None:
  workdir = pathlib.Path(sweep.workdir(str(root), run))
  workdir.mkdir(parents=True)
  if config is not None:
    (workdir / "config.json").write_text(json.dumps(config, indent=2))
  if lines is not None:
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _find(runs: list[sweep.Run], **args: Any) -> sweep.Run:
  (run,) = [r for r in runs if all(r.args[k] == v for k, v in args.items()
                                   if k != "dataset")
            and r.run_id.startswith(args.get("dataset", ""))]
  return run


@pytest.fixture()
def fig1_root(tmp_path: pathlib.Path) -> pathlib.Path:
  """fig1: S/32 softmax finished; S/32 relu finished after a resume (steps logged twice);
  S/16 softmax running without any eval yet; S/16 relu running (eval at 60, training at 80);
  B/32 softmax started (config.json only); the other 5 missing."""
  runs = sweep.load_sweep(FIG1)
  root = tmp_path / "runs"
  _write_run(root, runs[0], [
      {"step": 50, "training_loss": 2.0, "core_hours": 5.0},
      {"step": 100, "training_loss": 1.5, "core_hours": 10.0, "i1k/prec@1": 0.5,
       "fewshot/10shot_avg": 0.4},
  ], _steps(100))
  last = I21K_TOTAL
  _write_run(root, runs[1], [
      {"step": 103_000, "training_loss": 1.8, "core_hours": 8.0},
      {"step": last, "training_loss": 1.7, "core_hours": 9.0, "i1k/prec@1": 0.45,
       "fewshot/10shot_avg": 0.35},
      # Preempted before the final checkpoint was durable: resumed from 103,000.
      {"step": 103_000, "training_loss": 1.8, "core_hours": 9.5},
      {"step": last, "training_loss": 1.6, "core_hours": 11.5, "i1k/prec@1": 0.47,
       "fewshot/10shot_avg": 0.37},
  ], I21K_CONFIG)
  _write_run(root, runs[2], [
      {"step": 50, "training_loss": 3.0, "core_hours": 20.0},
  ], _steps(100))
  _write_run(root, runs[3], [
      {"step": 60, "training_loss": 2.5, "core_hours": 24.0, "i1k/prec@1": 0.2,
       "fewshot/10shot_avg": 0.1},
      {"step": 80, "training_loss": 2.25, "core_hours": 32.0},
  ], _steps(100))
  _write_run(root, runs[4], None, _steps(100))
  return root


def test_parse_metrics_replays_resumes_and_later_lines_win():
  lines = [json.dumps(record) for record in [
      {"step": 10, "training_loss": 3.0},
      {"step": 20, "training_loss": 2.0},
      {"step": 30, "training_loss": 1.5, "i1k/prec@1": 0.3},
      {"step": 40, "training_loss": 1.0},  # lost: the run resumed from step 20's checkpoint
      {"step": 30, "training_loss": 1.6},
      {"step": 30, "i1k/prec@1": 0.31},  # a second line for the same step is merged
  ]] + ['{"step": 4']  # a half-written last line
  records = metrics_lib.parse_metrics(lines)
  assert records == {10: {"training_loss": 3.0}, 20: {"training_loss": 2.0},
                     30: {"training_loss": 1.6, "i1k/prec@1": 0.31}}
  assert run_status.last_values({10: {"a": 1.0, "b": 5.0}, 20: {"a": 2.0}}, ("a", "b", "c")) == {
      "a": 2.0, "b": 5.0}


def test_total_steps_from_config():
  assert run_status.total_steps(_steps(123)) == 123
  assert run_status.total_steps(I21K_CONFIG) == I21K_TOTAL
  i1k = {"total_epochs": 300, "input": {"batch_size": 4096, "data": {
      "name": "imagenet2012", "split": "train[:99%]"}}}
  assert run_status.total_steps(i1k) == 92_898
  assert run_status.total_steps({"total_epochs": 3, "input": {"batch_size": 8, "data": {
      "name": "unknown", "split": "train"}}}) is None
  assert run_status.total_steps({"total_examples": 80, "input": {"batch_size": 8}}) == 10
  assert run_status.total_steps({}) is None


def test_collect_fig1(fig1_root):
  rows = run_status.collect(FIG1, str(fig1_root), PAPER)
  assert [r.status for r in rows] == ["finished", "finished", "running", "running", "running",
                                      *["missing"] * 5]
  assert rows[1].step == I21K_TOTAL and rows[1].total_steps == I21K_TOTAL
  assert rows[1].metrics == {"i1k/prec@1": 0.47, "fewshot/10shot_avg": 0.37,
                             "core_hours": 11.5, "training_loss": 1.6}
  # The last value of each metric, even when logged at different steps.
  assert rows[3].step == 80 and rows[3].metrics == {
      "i1k/prec@1": 0.2, "fewshot/10shot_avg": 0.1, "core_hours": 32.0, "training_loss": 2.25}
  assert rows[4].step is None and rows[4].metrics == {}
  assert rows[0].dataset == "i21k" and rows[0].args == {
      "variant": "S/32", "attention": "softmax", "alpha": 1.0, "qk_norm": True, "gated": False}


def test_status_without_a_known_total(tmp_path):
  """Unknown total: finished when the last record has every evaluator's metrics."""
  run = sweep.Run("configs/vit_i21k.py", {"variant": "S/32"})
  config = {"total_epochs": 3, "input": {"batch_size": 8, "data": {"name": "?"}},
            "evals": {"i1k": {}, "fewshot": {}}}
  _write_run(tmp_path, run, [{"step": 5, "i1k/prec@1": 0.1}], config)
  workdir = sweep.workdir(str(tmp_path), run)
  assert run_status.collect_run(run, workdir).status == "running"
  with open(pathlib.Path(workdir) / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 9, "i1k/prec@1": 0.2, "fewshot/10shot_avg": 0.1}) + "\n")
  row = run_status.collect_run(run, workdir)
  assert (row.status, row.step, row.total_steps) == ("finished", 9, None)


def test_csv_and_markdown_fig1(fig1_root):
  rows = run_status.collect(FIG1, str(fig1_root), PAPER)
  lines = tables.to_csv(rows, PAPER).splitlines()
  assert len(lines) == 11
  assert lines[0] == ("run_id,dataset,variant,attention,alpha,qk_norm,gated,status,step,"
                      "total_steps,i1k/prec@1,fewshot/10shot_avg,core_hours,training_loss")
  assert lines[1] == ("i21k-S32-softmax-a1-qk_norm-nogated,i21k,S/32,softmax,1.0,True,False,"
                      "finished,100,100,0.5,0.4,10.0,1.5")
  assert lines[2] == ("i21k-S32-relu-a1-qk_norm-nogated,i21k,S/32,relu,1.0,True,False,"
                      "finished,103608,103608,0.47,0.37,11.5,1.6")
  assert lines[3] == ("i21k-S16-softmax-a1-qk_norm-nogated,i21k,S/16,softmax,1.0,True,False,"
                      "running,50,100,,,20.0,3.0")
  assert lines[5] == ("i21k-B32-softmax-a1-qk_norm-nogated,i21k,B/32,softmax,1.0,True,False,"
                      "running,,100,,,,")
  assert lines[10] == ("i21k-L16-relu-a1-qk_norm-nogated,i21k,L/16,relu,1.0,True,False,"
                       "missing,,,,,,")

  md = tables.to_markdown(rows, PAPER, title="fig1").splitlines()
  assert md[0] == "# fig1"
  assert md[2] == ("10 runs: 2 finished, 3 running, 5 missing. Values are the last logged "
                   "ones.")
  assert md[4] == ("| run | dataset | variant | attention | alpha | qk_norm | gated | status | "
                   "step | i1k acc | 10-shot avg | core hours | train loss |")
  assert md[7] == ("| i21k-S32-relu-a1-qk_norm-nogated | i21k | S/32 | relu | 1 | True | False "
                   "| finished | 103608/103608 | 0.4700 | 0.3700 | 11.5 | 1.6000 |")
  assert md[9] == ("| i21k-S16-relu-a1-qk_norm-nogated | i21k | S/16 | relu | 1 | True | False "
                   "| running | 80/100 | 0.2000 | 0.1000 | 32.0 | 2.2500 |")
  assert md[15] == ("| i21k-L16-relu-a1-qk_norm-nogated | i21k | L/16 | relu | 1 | True | "
                    "False | missing | - | - | - | - | - |")
  assert len(md) == 16  # no seeds: no table over seeds


def _collections(ax, gid: str) -> list:
  return [c for c in ax.collections if c.get_gid() == gid]


def test_fig1_panels(fig1_root):
  rows = run_status.collect(FIG1, str(fig1_root), PAPER)
  figure = figures.plot_sweep("fig1", rows, PAPER)
  assert len(figure.axes) == 2
  left, right = figure.axes
  assert left.get_ylabel() == "ImageNet-1k accuracy"
  assert right.get_ylabel() == "10-shot linear transfer (avg of 8)"
  for ax in (left, right):
    assert ax.get_xlabel() == "TPU core hours" and ax.get_xscale() == "log"
    softmax, relu = ax.lines
    assert (softmax.get_label(), relu.get_label()) == ("softmax", "relu/seqlen")
    assert list(softmax.get_xdata()) == [10.0]
    assert list(relu.get_xdata()) == [11.5, 32.0]  # sorted by core hours
    assert relu.get_markevery() == [True, False]  # the running S/16 run: hollow marker
    (running,) = _collections(ax, "running")
    assert running.get_offsets().tolist() == [[32.0, relu.get_ydata()[1]]]
    assert ax.get_title().endswith("(7 missing)")
    (note,) = [t for t in ax.texts if t.get_gid() == "missing"]
    assert note.get_text() == ("no value:\nsoftmax: S/16, B/32, B/16, L/16\n"
                               "relu/seqlen: B/32, B/16, L/16")
  annotations = [t.get_text() for t in left.texts if t.get_gid() != "missing"]
  assert sorted(annotations) == ["S/16", "S/32", "S/32"]


@pytest.fixture()
def fig2_root(tmp_path: pathlib.Path) -> pathlib.Path:
  """fig2: i21k S/32 softmax, relu at alpha 0 and 1, gelu at 1 finished, relu at 2 running;
  i1k S/16 softmax running; the other 336 runs missing."""
  runs = sweep.load_sweep(FIG2)
  root = tmp_path / "runs"
  finished = [
      ({"dataset": "i21k", "variant": "S/32", "attention": "softmax"}, 0.6),
      ({"dataset": "i21k", "variant": "S/32", "attention": "relu", "alpha": 0.0}, 0.3),
      ({"dataset": "i21k", "variant": "S/32", "attention": "relu", "alpha": 1.0}, 0.58),
      ({"dataset": "i21k", "variant": "S/32", "attention": "gelu", "alpha": 1.0}, 0.57),
  ]
  for args, accuracy in finished:
    run = _find(runs, **args)
    if pathlib.Path(sweep.workdir(str(root), run)).exists():
      continue  # a run Figure 1 lists too (S/32 softmax), written by fig1_root: trained once
    _write_run(root, run, [
        {"step": 10, "training_loss": 1.0, "core_hours": 1.0, "i1k/prec@1": accuracy}
    ], _steps(10))
  _write_run(root, _find(runs, dataset="i21k", variant="S/32", attention="relu",
                               alpha=2.0),
             [{"step": 5, "training_loss": 1.0, "i1k/prec@1": 0.2}], _steps(10))
  _write_run(root, _find(runs, dataset="i1k", variant="S/16", attention="softmax"),
             [{"step": 5, "training_loss": 1.0, "i1k/prec@1": 0.7}], _steps(10))
  return root


def test_fig2_panels(fig2_root):
  rows = run_status.collect(FIG2, str(fig2_root), PAPER)
  assert sum(r.status == "finished" for r in rows) == 4
  assert sum(r.status == "running" for r in rows) == 2
  figure = figures.plot_sweep("fig2", rows, PAPER)
  assert len(figure.axes) == 6
  axes = [figure.axes[:3], figure.axes[3:]]
  titles = [[ax.get_title() for ax in row] for row in axes]
  assert titles == [["i21k S/32 (52 missing)", "i21k S/16 (57 missing)",
                     "i21k S/8 (57 missing)"],
                    ["i1k S/32 (57 missing)", "i1k S/16 (56 missing)", "i1k S/8 (57 missing)"]]
  activations = ["relu", "relu2", "gelu", "softplus", "identity", "relu6", "sigmoid"]
  for i, row in enumerate(axes):
    assert "ImageNet-1k accuracy" in row[0].get_ylabel()
    for j, ax in enumerate(row):
      has_softmax = (i, j) in ((0, 0), (1, 1))
      assert [line.get_label() for line in ax.lines] == activations + ["softmax"] * has_softmax
      assert "alpha" in ax.get_xlabel() if i == 1 else ax.get_xlabel() == ""
      missing = sum(len(c.get_offsets()) for c in _collections(ax, "missing"))
      assert missing == (52 if (i, j) == (0, 0) else 56)
  panel = axes[0][0]
  relu, gelu, softmax = panel.lines[0], panel.lines[2], panel.lines[-1]
  assert list(relu.get_xdata()) == [0.0, 1.0, 2.0]
  assert list(relu.get_ydata()) == [0.3, 0.58, 0.2]
  assert relu.get_markevery() == [True, True, False]
  (running,) = _collections(panel, "running")
  assert running.get_offsets().tolist() == [[2.0, 0.2]]
  assert list(gelu.get_xdata()) == [1.0]
  assert list(softmax.get_ydata()) == [0.6, 0.6] and softmax.get_linestyle() == "--"
  assert axes[1][1].lines[-1].get_linestyle() == ":"  # the running softmax run


def test_fig3_and_fig4_layout(tmp_path):
  for name, labels in (("fig3", ["relu, qk-LN", "relu, no qk-LN", "relu2, qk-LN",
                                 "relu2, no qk-LN"]),
                       ("fig4", ["relu, gate", "relu, no gate", "relu2, gate",
                                 "relu2, no gate"])):
    rows = run_status.collect(str(ROOT / f"configs/paper/{name}.py"), str(tmp_path / "empty"),
                              PAPER)
    assert {r.status for r in rows} == {"missing"}
    figure = figures.plot_sweep(name, rows, PAPER)
    assert len(figure.axes) == 3
    for ax, variant in zip(figure.axes, ("S/32", "S/16", "S/8"), strict=True):
      assert ax.get_title() == f"i21k {variant} (32 missing)"
      assert [line.get_label() for line in ax.lines] == labels
      assert [line.get_linestyle() for line in ax.lines] == ["-", "--", "-", "--"]
  assert figures.plot_sweep("other_sweep", rows, PAPER) is None
  assert figures.figure_kind("fig2_small") == "fig2" and figures.figure_kind("fig12") is None


def test_cli_writes_tables_and_figures(fig1_root, fig2_root, tmp_path):
  # Both fixtures share tmp_path / "runs" (one runs/<run id> per run; S/32 softmax is in both).
  out = tmp_path / "results"
  result = subprocess.run(
      [sys.executable, "-m", "big_vision_relu.experiments.report", "--sweep", FIG1,
       "--sweep", FIG2, "--root", str(fig1_root), "--out", str(out)], cwd=ROOT,
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  printed = result.stdout.split()
  assert printed == [str(out / f) for f in ("fig1.md", "fig1.png", "fig2.md", "fig2.png")]
  for name in ("fig1", "fig2"):
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv_lines = (out / f"{name}.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + (10 if name == "fig1" else 342)
  assert (out / "fig1.md").read_text().splitlines()[0] == f"# fig1 ({fig1_root})"
  assert "missing" in (out / "fig2.md").read_text()


# ------------------------------------------------------------------- reproduction-style sweeps

REPRO_CONFIG = "configs/repro/mnist_vit.py"
REPRO_FIGURE = sweep.FigureSpec(
    accuracy_metric="test/prec@1", accuracy_label="mnist5k test accuracy",
    fewshot_metric="fewshot/10shot_avg", fewshot_label="10-shot digits transfer",
    core_hours_label="CPU core hours", panel_key="patch", panel_title="mnist5k, patch {value}",
    size_key="size")


def _repro_args(**args: Any) -> dict[str, Any]:
  """A run's args in the reproduction's order: S, patch 4, relu, alpha 1, qk-LN, no gate, seed 0
  unless overridden."""
  return {"size": "S", "patch": 4, "attention": "relu", "alpha": 1.0, "qk_norm": True,
          "gated": False, "seed": 0, **args}


def _repro_sweep(tmp_path: pathlib.Path, name: str, grid: list[dict[str, Any]]) -> str:
  """A sweep file `<name>.py` with FIGURE = REPRO_FIGURE and a run per args of `grid`."""
  path = tmp_path / f"{name}.py"
  path.write_text(f"from big_vision_relu.experiments.sweep import FigureSpec, Run\n\n"
                  f"FIGURE = {REPRO_FIGURE!r}\n\n\n"
                  f"def get_sweep():\n  return [Run({REPRO_CONFIG!r}, a) for a in {grid!r}]\n")
  return str(path)


def _repro_run(root: pathlib.Path, sweep_path: str, metrics: dict[str, float], *,
               finished: bool = True, **args: Any) -> None:
  """A run (of 10 steps) that logged `metrics` at its last step (10, or 5 when not finished)."""
  _write_run(root, sweep.Run(REPRO_CONFIG, _repro_args(**args)),
             [{"step": 10 if finished else 5, **metrics}], _steps(10))


def _metrics(accuracy: float, fewshot: float, core_hours: float,
             loss: float) -> dict[str, float]:
  return {"test/prec@1": accuracy, "fewshot/10shot_avg": fewshot, "core_hours": core_hours,
          "training_loss": loss}


# Figure 1 over 3 seeds: (size, attention) -> one (accuracy, few-shot, core hours, loss) per
# seed, or a dict of a running run's metrics, or None for a missing run.
REPRO_FIG1 = {
    ("Ti", "softmax"): [(0.80, 0.50, 0.020, 0.30), (0.82, 0.60, 0.022, 0.20),
                        (0.87, 0.55, 0.024, 0.25)],
    ("Ti", "relu"): [(0.78, 0.52, 0.030, 0.35), (0.84, 0.58, 0.034, 0.45), None],
    ("S", "softmax"): [(0.90, 0.70, 0.050, 0.40), {"training_loss": 0.5, "core_hours": 0.03},
                       None],
    ("S", "relu"): [None, None, None],
}


@pytest.fixture()
def repro_fig1(tmp_path: pathlib.Path) -> tuple[str, pathlib.Path]:
  """(sweep file, root) of a Figure 1 over Ti / S, softmax / relu, seeds 0-2 (REPRO_FIG1)."""
  path = _repro_sweep(tmp_path, "fig1_mini", [
      _repro_args(size=size, attention=attention, seed=seed)
      for size, attention in REPRO_FIG1 for seed in range(3)])
  root = tmp_path / "runs"
  for (size, attention), seeds in REPRO_FIG1.items():
    for seed, values in enumerate(seeds):
      if isinstance(values, tuple):
        _repro_run(root, path, _metrics(*values), size=size, attention=attention, seed=seed)
      elif values is not None:
        _repro_run(root, path, values, finished=False, size=size, attention=attention,
                   seed=seed)
  return path, root


def test_groups_over_seeds(repro_fig1):
  path, root = repro_fig1
  assert sweep.load_figure_spec(path) == REPRO_FIGURE
  rows = run_status.collect(path, str(root), REPRO_FIGURE)
  assert len(rows) == 12 and rows[0].dataset == "mnist_vit"
  assert rows[0].metrics == _metrics(0.80, 0.50, 0.020, 0.30)
  groups = stats.group_rows(rows)
  assert [(g.args["size"], g.args["attention"]) for g in groups] == list(REPRO_FIG1)
  assert groups[0].args == {"size": "Ti", "patch": 4, "attention": "softmax", "alpha": 1.0,
                            "qk_norm": True, "gated": False}
  assert [len(g.rows) for g in groups] == [3, 3, 3, 3]
  assert [g.status for g in groups] == ["finished", "running", "running", "missing"]
  for group, seeds in zip(groups, REPRO_FIG1.values(), strict=True):
    for i, metric in enumerate(run_status.spec_metrics(REPRO_FIGURE)):
      values = [v[i] for v in seeds if isinstance(v, tuple)]
      values += [v[metric] for v in seeds if isinstance(v, dict) and metric in v]
      stat = group.stat(metric)
      if not values:
        assert stat is None and group.value(metric) is None
        continue
      assert stat.n == len(values)
      assert stat.mean == pytest.approx(np.mean(values), rel=1e-12) == group.value(metric)
      if len(values) == 1:
        assert stat.std is None
      else:
        assert stat.std == pytest.approx(np.std(values, ddof=1), rel=1e-12)
        assert stat.std == statistics.stdev(values)
  assert groups[0].stat("test/prec@1").std == pytest.approx(0.0360555127546399, rel=1e-12)
  assert groups[2].stat("test/prec@1") == stats.Stat(0.9, None, 1)  # seed 1 logged no accuracy
  assert groups[2].stat("core_hours").n == 2


def test_markdown_and_csv_over_seeds(repro_fig1):
  path, root = repro_fig1
  rows = run_status.collect(path, str(root), REPRO_FIGURE)
  csv_lines = tables.to_csv(rows, REPRO_FIGURE).splitlines()
  assert len(csv_lines) == 13  # one line per run
  assert csv_lines[0] == ("run_id,dataset,size,patch,attention,alpha,qk_norm,gated,seed,status,"
                          "step,total_steps,test/prec@1,fewshot/10shot_avg,core_hours,"
                          "training_loss")
  md = tables.to_markdown(rows, REPRO_FIGURE, title="fig1_mini").splitlines()
  assert md[4] == ("| run | dataset | size | patch | attention | alpha | qk_norm | gated | seed "
                   "| status | step | test acc | 10-shot avg | core hours | train loss |")
  assert md[6] == ("| mnist_vit-Ti-p4-softmax-a1-qk_norm-nogated-seed0 | mnist_vit | Ti | 4 | "
                   "softmax | 1 | True | False | 0 | finished | 10/10 | 0.8000 | 0.5000 | 0.020 "
                   "| 0.3000 |")
  summary = md[md.index("## Mean ± std over seeds"):]
  assert summary[2].startswith("4 groups of runs that differ only in the seed.")
  assert summary[4:] == [
      ("| dataset | size | patch | attention | alpha | qk_norm | gated | status | seeds | "
       "test acc | 10-shot avg | core hours | train loss |"),
      "|" + "---|" * 13,
      ("| mnist_vit | Ti | 4 | softmax | 1 | True | False | finished | 3 | 0.8300 ± 0.0361 (3) "
       "| 0.5500 ± 0.0500 (3) | 0.022 ± 0.002 (3) | 0.2500 ± 0.0500 (3) |"),
      ("| mnist_vit | Ti | 4 | relu | 1 | True | False | running | 3 | 0.8100 ± 0.0424 (2) | "
       "0.5500 ± 0.0424 (2) | 0.032 ± 0.003 (2) | 0.4000 ± 0.0707 (2) |"),
      ("| mnist_vit | S | 4 | softmax | 1 | True | False | running | 3 | 0.9000 (1) | "
       "0.7000 (1) | 0.040 ± 0.014 (2) | 0.4500 ± 0.0707 (2) |"),
      "| mnist_vit | S | 4 | relu | 1 | True | False | missing | 3 | - | - | - | - |",
  ]
  assert "Gate cost" not in "\n".join(md)


def _segments(ax, gid: str) -> list[list[list[float]]]:
  """The segments of the LineCollections with `gid` (error bars), rounded to 1e-9."""
  return [np.round(segment, 9).tolist() for c in _collections(ax, gid)
          for segment in c.get_segments()]


def test_repro_fig1_panels(repro_fig1):
  path, root = repro_fig1
  rows = run_status.collect(path, str(root), REPRO_FIGURE)
  figure = figures.plot_sweep("fig1_mini", rows, REPRO_FIGURE)
  left, right = figure.axes
  assert (left.get_ylabel(), right.get_ylabel()) == ("mnist5k test accuracy",
                                                     "10-shot digits transfer")
  assert left.get_xlabel() == right.get_xlabel() == "CPU core hours"
  assert left.get_title() == "mnist5k test accuracy (1 missing)"
  softmax, relu = left.lines
  assert (softmax.get_label(), relu.get_label()) == ("softmax", "relu/seqlen")
  # Group means: Ti over 3 seeds, S over the seeds that logged each metric.
  assert softmax.get_xdata() == pytest.approx([0.022, 0.04], rel=1e-12)
  assert softmax.get_ydata() == pytest.approx([0.83, 0.9], rel=1e-12)
  assert softmax.get_markevery() == [True, False]  # S: a seed is running, one missing
  assert relu.get_xdata() == pytest.approx([0.032], rel=1e-12)
  assert relu.get_markevery() == [False]
  # ± 1 std bars where a group has 2 values or more: Ti softmax (3) and Ti relu (2), not S (1).
  std_ti_softmax = statistics.stdev([0.80, 0.82, 0.87])
  std_ti_relu = statistics.stdev([0.78, 0.84])
  assert _segments(left, "std") == np.round([
      [[0.022, 0.83 - std_ti_softmax], [0.022, 0.83 + std_ti_softmax]],
      [[0.032, 0.81 - std_ti_relu], [0.032, 0.81 + std_ti_relu]]], 9).tolist()
  running = [np.round(c.get_offsets(), 9).tolist() for c in _collections(left, "running")]
  assert running == [[[0.04, 0.9]], [[0.032, 0.81]]]
  (note,) = [t for t in left.texts if t.get_gid() == "missing"]
  assert note.get_text() == "no value:\nrelu/seqlen: S"
  assert sorted(t.get_text() for t in left.texts if t.get_gid() != "missing") == [
      "S", "Ti", "Ti"]  # labelled by size
  assert right.lines[0].get_ydata() == pytest.approx([0.55, 0.7], rel=1e-12)  # few-shot means
  assert "mean over seeds" in figure.legends[0].get_title().get_text()


def test_repro_fig2_panels_by_patch(tmp_path):
  """Columns = patch values in the sweep's order (4 before 2); softmax's band of ± 1 std."""
  grid = [_repro_args(patch=patch, attention=attention, alpha=alpha, seed=seed)
          for patch in (4, 2) for attention, alpha in (("softmax", 1.0), ("relu", 0.0),
                                                       ("relu", 1.0)) for seed in (0, 1)]
  path = _repro_sweep(tmp_path, "fig2_mini", grid)
  root = tmp_path / "runs"
  for seed, accuracy in ((0, 0.9), (1, 0.8)):
    _repro_run(root, path, {"test/prec@1": accuracy}, attention="softmax", seed=seed)
  for seed, accuracy in ((0, 0.5), (1, 0.6)):
    _repro_run(root, path, {"test/prec@1": accuracy}, alpha=0.0, seed=seed)
  _repro_run(root, path, {"test/prec@1": 0.88}, alpha=1.0, seed=0)  # seed 1 missing
  rows = run_status.collect(path, str(root), REPRO_FIGURE)
  figure = figures.plot_sweep("fig2_mini", rows, REPRO_FIGURE)
  assert [ax.get_title() for ax in figure.axes] == ["mnist5k, patch 4",
                                                    "mnist5k, patch 2 (3 missing)"]
  assert figure.axes[0].get_ylabel() == "mnist5k test accuracy"  # one dataset: not named
  panel = figure.axes[0]
  relu, softmax = panel.lines
  assert list(relu.get_xdata()) == [0.0, 1.0]
  assert relu.get_ydata() == pytest.approx([0.55, 0.88], rel=1e-12)
  assert relu.get_markevery() == [True, False]
  std_relu = statistics.stdev([0.5, 0.6])
  assert _segments(panel, "std") == np.round([[[0.0, 0.55 - std_relu],
                                               [0.0, 0.55 + std_relu]]], 9).tolist()
  assert softmax.get_ydata() == pytest.approx([0.85, 0.85], rel=1e-12)
  assert softmax.get_linestyle() == "--"
  (band,) = [p for p in panel.patches if p.get_gid() == "std"]
  std_softmax = statistics.stdev([0.9, 0.8])
  assert band.get_y() == pytest.approx(0.85 - std_softmax, rel=1e-12)
  assert band.get_height() == pytest.approx(2 * std_softmax, rel=1e-12)
  assert not _collections(figure.axes[1], "std")
  figure.canvas.draw()  # the conventions above the legend fit the figure's width
  assert figure.legends[0].get_title().get_window_extent().width < figure.bbox.width


# Figure 4, seed 0: (patch, alpha, gated) -> core hours of a finished run, or None: running.
REPRO_FIG4 = {(4, 0.0, False): 1.0, (4, 0.0, True): 1.1, (4, 1.0, False): 2.0,
              (4, 1.0, True): 2.3, (2, 0.0, False): 4.0, (2, 0.0, True): 5.0,
              (2, 1.0, False): 3.0, (2, 1.0, True): None}


def test_repro_fig4_gate_cost(tmp_path, capsys):
  path = _repro_sweep(tmp_path, "fig4_mini", [
      _repro_args(patch=p, alpha=a, gated=g) for p, a, g in REPRO_FIG4])
  root = tmp_path / "runs"
  for (patch, alpha, gated), core_hours in REPRO_FIG4.items():
    _repro_run(root, path, {"test/prec@1": 0.8, "core_hours": core_hours or 1.0},
               finished=core_hours is not None, patch=patch, alpha=alpha, gated=gated)
  rows = run_status.collect(path, str(root), REPRO_FIGURE)
  ratios = stats.gate_cost_ratios(rows)
  assert [(r.args["patch"], r.args["alpha"], r.args["gated"]) for r, _ in ratios] == [
      (4, 0.0, True), (4, 1.0, True), (2, 0.0, True)]  # patch 2, alpha 1: gated run running
  assert [q for _, q in ratios] == pytest.approx([1.1, 1.15, 1.25], rel=1e-12)

  out = tmp_path / "results"
  report.report_sweeps([path], str(root), str(out))
  assert capsys.readouterr().out.split() == [str(out / "fig4_mini.md"),
                                             str(out / "fig4_mini.png")]
  md = (out / "fig4_mini.md").read_text().splitlines()
  gate = md[md.index("## Gate cost: core hours with gate / without gate"):]
  assert gate[4:] == ["| patch | with / without gate |", "|---|---|",
                      "| 4 | 1.1250 ± 0.0354 (2) |", "| 2 | 1.2500 (1) |",
                      "| all | 1.1667 ± 0.0764 (3) |"]
  assert statistics.stdev([1.1, 1.15, 1.25]) == pytest.approx(0.0763763, rel=1e-6)
  assert "## Mean ± std over seeds" in md  # the runs have a seed (one each)
  assert (out / "fig4_mini.csv").read_text().splitlines()[0].endswith(
      "seed,status,step,total_steps,test/prec@1,fewshot/10shot_avg,core_hours,training_loss")

  figure = figures.plot_sweep("fig4_mini", rows, REPRO_FIGURE)
  assert [ax.get_title() for ax in figure.axes] == ["mnist5k, patch 4", "mnist5k, patch 2"]
  assert [line.get_label() for line in figure.axes[0].lines] == ["relu, gate", "relu, no gate"]
  assert figure.axes[0].get_ylabel() == "mnist5k test accuracy"
  assert tables.to_markdown(rows, REPRO_FIGURE).count("Gate cost") == 0  # fig4 sweeps only


def test_alpha_tables_use_finished_runs_only(tmp_path):
  """fig2-4 Markdown: per column of the figure, series x alpha of the finished runs' accuracy
  (mean ± std over seeds); a running run's last value (e.g. step 1's) is not a result."""
  grid = [_repro_args(attention=a, alpha=alpha, seed=seed, qk_norm=qk)
          for a in ("relu", "relu2") for alpha in (0.0, 1.0) for seed in (0, 1)
          for qk in (True, False)]
  path = _repro_sweep(tmp_path, "fig3_mini", grid)
  root = tmp_path / "runs"
  accuracies = {("relu", 0.0, True): (0.50, 0.60), ("relu", 1.0, True): (0.80, 0.90),
                ("relu2", 1.0, False): (0.70, None)}
  for (attention, alpha, qk), seeds in accuracies.items():
    for seed, accuracy in enumerate(seeds):
      if accuracy is not None:
        _repro_run(root, path, _metrics(accuracy, 0.5, 0.05, 0.3), attention=attention,
                   alpha=alpha, seed=seed, qk_norm=qk)
  # Running: logged 0.1 at step 5 of 10; it must not show up.
  _repro_run(root, path, {"test/prec@1": 0.1}, finished=False, attention="relu2", alpha=0.0,
             seed=0, qk_norm=True)
  # Diverged (the study's marker): its last values are dropped and the cell says so.
  _repro_run(root, path, {"test/prec@1": 0.1}, finished=False, attention="relu", alpha=0.0,
             seed=0, qk_norm=False)
  diverged = sweep.Run(REPRO_CONFIG, _repro_args(attention="relu", alpha=0.0, seed=0,
                                                 qk_norm=False))
  workdir = pathlib.Path(sweep.workdir(str(root), diverged))
  (workdir / run_status.DIVERGED_FILE).write_text("FloatingPointError: Non-finite loss\n")
  row = run_status.collect_run(diverged, workdir, REPRO_FIGURE)
  assert (row.status, row.step, row.metrics) == ("diverged", 5, {})
  out = report.write_report(path, str(root), str(tmp_path / "out"))
  md = pathlib.Path(out["md"]).read_text().splitlines()
  table = md[md.index("### mnist5k, patch 4"):]
  assert table[2:8] == [
      "| attention, qk_norm | alpha 0 | alpha 1 |",
      "|---|---|---|",
      (f"| relu, qk_norm=True | 0.5500 ± {np.std([0.5, 0.6], ddof=1):.4f} (2) | "
       f"0.8500 ± {np.std([0.8, 0.9], ddof=1):.4f} (2) |"),
      "| relu, qk_norm=False | diverged | - |",
      "| relu2, qk_norm=True | - | - |",
      "| relu2, qk_norm=False | - | 0.7000 (1) |",
  ]


def test_the_step_1_evaluation_is_no_result(tmp_path):
  """Evaluators also run at step 1 (the initialisation): a run stopped after it has no accuracy
  to show yet, though its core hours and loss are kept."""
  path = _repro_sweep(tmp_path, "fig2_mini", [_repro_args()])
  run = sweep.Run(REPRO_CONFIG, _repro_args())
  _write_run(tmp_path / "runs", run,
             [{"step": 1, "test/prec@1": 0.1, "fewshot/10shot_avg": 0.4, "core_hours": 0.01,
               "training_loss": 2.3}], _steps(10))
  (row,) = run_status.collect(path, str(tmp_path / "runs"), REPRO_FIGURE)
  assert (row.status, row.metrics) == ("running", {"core_hours": 0.01, "training_loss": 2.3})


def test_percent_axis_labels_stay_distinct_on_a_narrow_range():
  import matplotlib.pyplot as plt
  figure, ax = plt.subplots()
  ax.plot([0, 1], [0.885, 0.897])  # accuracies 1.2 points apart
  figures._percent_axis(ax)
  figure.canvas.draw()
  labels = [label.get_text() for label in ax.get_yticklabels()]
  plt.close(figure)
  assert len(labels) > 2 and len(set(labels)) == len(labels), labels


def test_a_run_shared_by_several_figures_trains_once_and_every_report_finds_it(tmp_path):
  """Figure 3's qk-LN-on half is Figure 2's runs: one workdir per run id, <root>/runs/<id>,
  written by Figure 2's sweep and read by Figure 3's report as a finished run."""
  fig3 = str(ROOT / "configs/paper/fig3.py")
  fig2_runs = {r.run_id: r for r in sweep.load_sweep(FIG2)}
  fig3_runs = {r.run_id: r for r in sweep.load_sweep(fig3)}
  shared = sorted(set(fig2_runs) & set(fig3_runs))
  assert len(shared) == 48
  run_id = shared[0]
  root = str(tmp_path)
  assert (sweep.workdir(root, fig2_runs[run_id])
          == sweep.workdir(root, fig3_runs[run_id]) == f"{root}/runs/{run_id}")
  _write_run(tmp_path, fig2_runs[run_id], [  # trained once, by Figure 2's sweep
      {"step": I21K_TOTAL, "training_loss": 1.7, "core_hours": 9.0, "i1k/prec@1": 0.45,
       "fewshot/10shot_avg": 0.35}], I21K_CONFIG)
  rows = {r.run_id: r for r in run_status.collect(fig3, root, sweep.load_figure_spec(fig3))}
  assert rows[run_id].status == "finished" and rows[run_id].metrics["i1k/prec@1"] == 0.45
  assert sum(r.status == "missing" for r in rows.values()) == len(rows) - 1


def test_every_run_id_names_one_config_across_the_paper_sweeps():
  """A shared workdir is only right if an id never names two configs: 544 runs listed by the
  four figures, 444 distinct, each id with one config."""
  configs: dict[str, str] = {}
  listed = 0
  for figure in ("fig1", "fig2", "fig3", "fig4"):
    for run in sweep.load_sweep(str(ROOT / f"configs/paper/{figure}.py")):
      listed += 1
      assert configs.setdefault(run.run_id, run.config_arg) == run.config_arg, run.run_id
  assert (listed, len(configs)) == (544, 444)
