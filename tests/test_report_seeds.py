"""The report (`big_vision_relu.experiments.report`, run_status, stats, tables, figures) on
sweeps in the miniature reproductions' style: a FigureSpec of their own, seeds (means, spreads,
error bars), panels by patch size, the gate's cost, alpha tables of finished runs only."""
from __future__ import annotations

import pathlib
import statistics
from typing import Any

import numpy as np
import pytest
from sweep_workdirs import collections, steps_config, write_run

from big_vision_relu.experiments import figures, report, run_status, stats, sweep, tables

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
  write_run(root, sweep.Run(REPRO_CONFIG, _repro_args(**args)),
             [{"step": 10 if finished else 5, **metrics}], steps_config(10))


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
  return [np.round(segment, 9).tolist() for c in collections(ax, gid)
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
  running = [np.round(c.get_offsets(), 9).tolist() for c in collections(left, "running")]
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
  assert not collections(figure.axes[1], "std")
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


def _legend_inside(figure) -> bool:
  """Whether every drawn part of the figure's legend (entries' texts and handles, the title of
  conventions) lies within the figure's width."""
  figure.canvas.draw()
  (legend,) = figure.legends
  parts = [*legend.get_texts(), *legend.legend_handles, legend.get_title()]
  extents = [part.get_window_extent() for part in parts]
  return min(e.x0 for e in extents) >= 0 and max(e.x1 for e in extents) <= figure.bbox.width


@pytest.mark.parametrize("name", ["fig2_mini", "fig4_mini"])
def test_a_one_panel_figure_wraps_its_legend_to_fit(tmp_path, name):
  """The Fashion-MNIST study's Figures 2-4 have one panel (patch 2): their legends and the
  marker conventions above them, one row and one line wide, were cut at the figure's edges.
  They now take as many columns and lines as fit; with two panels the legend stays one row."""
  activations = ("relu", "relu2", "gelu", "softplus", "sigmoid", "identity", "softmax")
  grid = {"fig2_mini": [dict(attention=a) for a in activations],
          "fig4_mini": [dict(attention=a, gated=g) for a in ("relu", "relu2")
                        for g in (True, False)]}[name]
  legends = {}
  for patches in ((2,), (4, 2)):
    (tmp_path / f"p{len(patches)}").mkdir()
    path = _repro_sweep(tmp_path / f"p{len(patches)}", name,
                        [_repro_args(patch=p, **args) for p in patches for args in grid])
    root = tmp_path / f"p{len(patches)}" / "runs"
    for patch in patches:
      for args in grid:
        _repro_run(root, path, {"test/prec@1": 0.8}, patch=patch, **args)
    figure = figures.plot_sweep(name, run_status.collect(path, str(root), REPRO_FIGURE),
                                REPRO_FIGURE)
    assert _legend_inside(figure)
    (legend,) = figure.legends
    assert len(legend.get_texts()) == len(grid)  # every series is in it
    columns = len({round(t.get_window_extent().x0) for t in legend.get_texts()})
    legends[len(patches)] = (columns, legend.get_title().get_text().count("\n") + 1)
  # (columns, lines of conventions): one panel wraps both; two keep one row, a line each.
  assert legends[1][0] < len(grid) and legends[1][1] == 3
  assert legends[2] == (len(grid), 2)


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
  write_run(tmp_path / "runs", run,
             [{"step": 1, "test/prec@1": 0.1, "fewshot/10shot_avg": 0.4, "core_hours": 0.01,
               "training_loss": 2.3}], steps_config(10))
  (row,) = run_status.collect(path, str(tmp_path / "runs"), REPRO_FIGURE)
  assert (row.status, row.metrics) == ("running", {"core_hours": 0.01, "training_loss": 2.3})
