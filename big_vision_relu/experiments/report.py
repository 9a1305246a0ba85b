r"""Results of a sweep: a CSV, a Markdown table and its figure, from the runs' workdirs; or a
study's report: its figures' sweeps, then its own report (verdicts).

    python -m big_vision_relu.experiments.report --sweep configs/paper/fig2.py \
        --root gs://BUCKET --out docs/results
    python -m big_vision_relu.experiments.report --sweep configs/repro/fig1.py \
        --sweep configs/repro/fig4.py --root results/repro --out docs/reproduction
    python -m big_vision_relu.experiments.report --plan fmnist --root results/fmnist
    bash launch/study.sh fmnist report        # the same

For each sweep file (or each sweep of the study's `Plan.figures`) it writes `<out>/<sweep>.csv`,
`<out>/<sweep>.md` and, when the sweep's name starts with fig1..fig4, `<out>/<sweep>.png`, and
prints the paths of the table and the figure. `--root` and `--out` may be local or gs://
(etils.epath). With `--plan`, `--out`
defaults to the study's `Plan.docs`, and the study's own report module (`Plan.report`) writes
the rest; a study without one says so and exits with EXIT_NO_REPORT.

What is reported comes from the sweep file's `FIGURE` (`sweep.FigureSpec`, the paper's when it
sets none): the accuracy and few-shot metrics and their labels, the core hours' label, and the
run argument whose values make the columns of Figures 2-4 (`panel_key`, titled with
`panel_title`).

The pieces, by job: `run_status` (what is read from a run's workdir, and its status), `stats`
(seed groups: mean ± std), `tables` (CSV, Markdown), `figures` (matplotlib).
"""
from __future__ import annotations

import importlib
import pathlib
import sys
from collections.abc import Sequence

from absl import app, flags
from etils import epath

from big_vision_relu.experiments import plans
from big_vision_relu.experiments import sweep as sweep_lib
from big_vision_relu.experiments.figures import figure_kind, plot_sweep
from big_vision_relu.experiments.run_status import collect_runs
from big_vision_relu.experiments.tables import to_csv, to_markdown

EXIT_NO_REPORT = 2  # --plan: the study has no report of its own (yet)


def write_report(sweep_path: str, root: str, out: str) -> dict[str, str]:
  """`write_sweep_report` of a sweep file, with its file's FigureSpec."""
  return write_sweep_report(sweep_lib.sweep_name(sweep_path), sweep_lib.load_sweep(sweep_path),
                            sweep_lib.load_figure_spec(sweep_path), root, out)


def write_sweep_report(name: str, runs: Sequence[sweep_lib.Run], spec: sweep_lib.FigureSpec,
                       root: str, out: str) -> dict[str, str]:
  """Collects the runs of the sweep `name` and writes <out>/<name>.csv, .md and (fig1..fig4)
  .png.

  Returns {'csv': path, 'md': path, 'png': path (only when a figure was drawn)}.
  """
  rows = collect_runs(runs, root, spec)
  out_dir = epath.Path(out)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {"csv": out_dir / f"{name}.csv", "md": out_dir / f"{name}.md"}
  paths["csv"].write_text(to_csv(rows, spec))
  paths["md"].write_text(to_markdown(rows, spec, title=f"{name} ({root})",
                                     alpha_tables=figure_kind(name) in ("fig2", "fig3",
                                                                        "fig4"),
                                     gate_cost=figure_kind(name) == "fig4"))
  figure = plot_sweep(name, rows, spec)
  if figure is not None:
    paths["png"] = out_dir / f"{name}.png"
    with paths["png"].open("wb") as f:
      figure.savefig(f, format="png", dpi=130)
  return {k: str(v) for k, v in paths.items()}


def _print_paths(name: str, paths: dict[str, str]) -> None:
  print(paths["md"])
  print(paths.get("png", f"(no figure for {name}: not fig1..fig4)"))
  sys.stdout.flush()


def report_sweeps(sweep_paths: Sequence[str], root: str, out_dir: str) -> None:
  """`write_report` for each sweep; prints the paths of its table and figure."""
  for sweep_path in sweep_paths:
    _print_paths(sweep_lib.sweep_name(sweep_path), write_report(sweep_path, root, out_dir))


def report_plan(plan: plans.Plan, root: str, out_dir: str) -> None:
  """A study's report: `write_sweep_report` for each of its `figures`, then its own report
  module's `write(archive, out)` (a local archive); prints the paths written. A study without a
  report module raises SystemExit(EXIT_NO_REPORT) saying so, after its figures."""
  for name in plan.figures:
    _print_paths(name, write_sweep_report(name, plan.sweep(name), plan.figure, root, out_dir))
  if plan.report is None:
    print(f"The {plan.name} study has no report of its own yet: its PLAN (in "
          f"{plans.STUDIES}.{plan.name}) sets none.", file=sys.stderr)
    raise SystemExit(EXIT_NO_REPORT)
  print(importlib.import_module(plan.report).write(pathlib.Path(root), pathlib.Path(out_dir)))


def main(argv: Sequence[str]) -> None:
  """`python -m big_vision_relu.experiments.report (--sweep FILE [--sweep FILE ...] | --plan
  NAME) --root DIR [--out DIR]`: tables (CSV, Markdown) and the figure of sweeps, from their
  runs' metrics.jsonl under ROOT/runs/<run id>; with --plan, the study's report."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}; pass --sweep or --plan, --root "
                         "and --out.")
  if bool(FLAGS.sweep) == bool(FLAGS.plan):
    raise app.UsageError("Pass --sweep (repeatable) or --plan, not both.")
  if FLAGS.plan:
    plan = plans.load(FLAGS.plan)
    report_plan(plan, FLAGS.root, FLAGS.out or plan.docs)
  else:
    report_sweeps(FLAGS.sweep, FLAGS.root, FLAGS.out or "docs/results")


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_multi_string("sweep", None, "A sweep file (configs/paper/fig2.py); repeatable.")
  flags.DEFINE_enum("plan", None, plans.names(), "A study (a unit of experiments/studies/).")
  flags.DEFINE_string("root", None, "The workdir root (local or gs://).", required=True)
  flags.DEFINE_string("out", None, "Output directory (local or gs://; default: docs/results, "
                      "or the study's docs).")
  app.run(main)
