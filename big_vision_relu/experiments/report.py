r"""Results of a sweep: a CSV, a Markdown table and its figure, from the runs' workdirs.

    python -m big_vision_relu.experiments.report --sweep configs/paper/fig2.py \
        --root gs://BUCKET --out docs/results
    python -m big_vision_relu.experiments.report --sweep configs/repro/fig1.py \
        --sweep configs/repro/fig4.py --root results/repro --out docs/reproduction

For each sweep file it writes `<out>/<sweep>.csv`, `<out>/<sweep>.md` and, when the sweep's
name starts with fig1..fig4, `<out>/<sweep>.png`, and prints the paths of the table and the
figure. `--root` and `--out` may be local or gs:// (etils.epath).

What is reported comes from the sweep file's `FIGURE` (`sweep.FigureSpec`, the paper's when it
sets none): the accuracy and few-shot metrics and their labels, the core hours' label, and the
run argument whose values make the columns of Figures 2-4 (`panel_key`, titled with
`panel_title`).

The pieces, by job: `run_status` (what is read from a run's workdir, and its status), `stats`
(seed groups: mean ± std), `tables` (CSV, Markdown), `figures` (matplotlib).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import app, flags
from etils import epath

from big_vision_relu.experiments import sweep as sweep_lib
from big_vision_relu.experiments.figures import figure_kind, plot_sweep
from big_vision_relu.experiments.run_status import collect
from big_vision_relu.experiments.tables import to_csv, to_markdown


def write_report(sweep_path: str, root: str, out: str) -> dict[str, str]:
  """Collects a sweep (with its file's FigureSpec) and writes <out>/<sweep>.csv, .md and
  (fig1..fig4) .png.

  Returns {'csv': path, 'md': path, 'png': path (only when a figure was drawn)}.
  """
  name = sweep_lib.sweep_name(sweep_path)
  spec = sweep_lib.load_figure_spec(sweep_path)
  rows = collect(sweep_path, root, spec)
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


def report_sweeps(sweep_paths: Sequence[str], root: str, out_dir: str) -> None:
  """`write_report` for each sweep; prints the paths of its table and figure."""
  for sweep_path in sweep_paths:
    paths = write_report(sweep_path, root, out_dir)
    print(paths["md"])
    print(paths.get("png", f"(no figure for {sweep_lib.sweep_name(sweep_path)}: not fig1..fig4)"))
    sys.stdout.flush()


def main(argv: Sequence[str]) -> None:
  """`python -m big_vision_relu.experiments.report --sweep FILE [--sweep FILE ...] --root DIR
  --out DIR`: tables (CSV, Markdown) and the figure of sweeps, from their runs' metrics.jsonl
  under ROOT/runs/<run id>."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}; pass --sweep, --root and --out.")
  report_sweeps(FLAGS.sweep, FLAGS.root, FLAGS.out)


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_multi_string("sweep", None, "A sweep file (configs/paper/fig2.py); repeatable.",
                            required=True)
  flags.DEFINE_string("root", None, "The workdir root (local or gs://).", required=True)
  flags.DEFINE_string("out", "docs/results", "Output directory (local or gs://).")
  app.run(main)
