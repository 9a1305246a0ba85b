"""`big_vision_relu.experiments.report` and its parts (run_status, tables, figures):
metrics.jsonl replay (resumes), run status, CSV / Markdown tables and the figures' panels, from
workdirs fabricated for part of the paper's Figures 1 and 2, and the paper sweeps' shared
workdirs. Sweeps in the miniature reproductions' style (a FigureSpec, seeds, the gate's cost):
test_report_seeds.py."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from conftest import ROOT
from sweep_workdirs import collections, steps_config, write_run

from big_vision_relu import metrics as metrics_lib
from big_vision_relu.experiments import figures, run_status, sweep, tables

FIG1 = str(ROOT / "configs/paper/fig1.py")
FIG2 = str(ROOT / "configs/paper/fig2.py")
PAPER = sweep.PAPER_FIGURE
I21K_CONFIG = {"total_epochs": 30, "total_steps": None,
               "input": {"batch_size": 4096, "data": {"name": "imagenet21k",
                                                      "split": "full[51200:]"}}}
I21K_TOTAL = 103_608  # as in test_configs.py


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
  write_run(root, runs[0], [
      {"step": 50, "training_loss": 2.0, "core_hours": 5.0},
      {"step": 100, "training_loss": 1.5, "core_hours": 10.0, "i1k/prec@1": 0.5,
       "fewshot/10shot_avg": 0.4},
  ], steps_config(100))
  last = I21K_TOTAL
  write_run(root, runs[1], [
      {"step": 103_000, "training_loss": 1.8, "core_hours": 8.0},
      {"step": last, "training_loss": 1.7, "core_hours": 9.0, "i1k/prec@1": 0.45,
       "fewshot/10shot_avg": 0.35},
      # Preempted before the final checkpoint was durable: resumed from 103,000.
      {"step": 103_000, "training_loss": 1.8, "core_hours": 9.5},
      {"step": last, "training_loss": 1.6, "core_hours": 11.5, "i1k/prec@1": 0.47,
       "fewshot/10shot_avg": 0.37},
  ], I21K_CONFIG)
  write_run(root, runs[2], [
      {"step": 50, "training_loss": 3.0, "core_hours": 20.0},
  ], steps_config(100))
  write_run(root, runs[3], [
      {"step": 60, "training_loss": 2.5, "core_hours": 24.0, "i1k/prec@1": 0.2,
       "fewshot/10shot_avg": 0.1},
      {"step": 80, "training_loss": 2.25, "core_hours": 32.0},
  ], steps_config(100))
  write_run(root, runs[4], None, steps_config(100))
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
  # A run's compute: core_hours at the highest step that logged it (not the last record's, which
  # an evaluation may write without it), in any order of the records; 0 when never logged.
  assert run_status.core_hours({30: {"val/loss": 0.3}, 20: {"core_hours": 2.5},
                                10: {"core_hours": 1.0}}) == 2.5
  assert run_status.core_hours({10: {"val/loss": 0.3}}) == 0.0


def test_total_steps_from_config():
  assert run_status.total_steps(steps_config(123)) == 123
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
  write_run(tmp_path, run, [{"step": 5, "i1k/prec@1": 0.1}], config)
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
    (running,) = collections(ax, "running")
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
    write_run(root, run, [
        {"step": 10, "training_loss": 1.0, "core_hours": 1.0, "i1k/prec@1": accuracy}
    ], steps_config(10))
  write_run(root, _find(runs, dataset="i21k", variant="S/32", attention="relu",
                               alpha=2.0),
             [{"step": 5, "training_loss": 1.0, "i1k/prec@1": 0.2}], steps_config(10))
  write_run(root, _find(runs, dataset="i1k", variant="S/16", attention="softmax"),
             [{"step": 5, "training_loss": 1.0, "i1k/prec@1": 0.7}], steps_config(10))
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
      missing = sum(len(c.get_offsets()) for c in collections(ax, "missing"))
      assert missing == (52 if (i, j) == (0, 0) else 56)
  panel = axes[0][0]
  relu, gelu, softmax = panel.lines[0], panel.lines[2], panel.lines[-1]
  assert list(relu.get_xdata()) == [0.0, 1.0, 2.0]
  assert list(relu.get_ydata()) == [0.3, 0.58, 0.2]
  assert relu.get_markevery() == [True, True, False]
  (running,) = collections(panel, "running")
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
  write_run(tmp_path, fig2_runs[run_id], [  # trained once, by Figure 2's sweep
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


@pytest.mark.parametrize("hours, expected", [
    ((0.64, 1.7), {"0.7", "0.8", "0.9", "1"}),  # less than a decade: minor ticks labelled
    ((0.05, 30.0), {"0.1", "1", "10"}),  # several decades: only powers of 10
])
def test_fig1_core_hours_axis_reads_as_plain_numbers(hours, expected):
  import matplotlib.pyplot as plt
  figure, ax = plt.subplots()
  ax.plot(hours, [0.90, 0.91])
  figures._log_x_axis(ax)
  figure.canvas.draw()
  labels = {t.get_text() for t in ax.get_xticklabels(minor=True) + ax.get_xticklabels()
            if ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]} - {""}
  plt.close(figure)
  assert labels == expected
