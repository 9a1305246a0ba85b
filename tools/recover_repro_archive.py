r"""Rebuilds archive entries of the miniature reproduction's runs from the report's CSV files.

Why: until 2026-11-23 the study kept its runs only in workdirs/repro (not in git). A session that
was cut off lost that directory with its checkout; what survived of the 135 runs that had
finished is one line per run in the committed report CSVs (docs/reproduction/fig*.csv, written
by `bash launch/repro.sh report` from the runs' metrics.jsonl). Since then the study archives
every done run in results/repro (big_vision_relu.experiments.study), and this tool put the
surviving lines there so they are not trained again. It was run once:

    python tools/recover_repro_archive.py docs/reproduction/fig*.csv --archive results/repro

For each run that a CSV lists as finished, and the archive lacks, it writes
`<archive>/runs/<run id>/`:
- config.json: the run's config (`sweep.load_config`, what the trainer would write);
- metrics.jsonl: ONE line, at the CSV's last step, with the CSV's values (test accuracy,
  10-shot transfer, core hours, training loss); the training curves are lost;
- RECOVERED: where the values came from.
and links it from the directories of its sweeps. The report reads these entries as it reads
any run: tests/test_study.py checks that the report gives the CSV's line back.
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib

from big_vision_relu.experiments import archive as archive_lib
from big_vision_relu.experiments import run_status
from big_vision_relu.experiments import sweep as sweep_lib
from big_vision_relu.experiments.studies import repro

RECOVERED_FILE = "RECOVERED"


def recover(csv_paths: list[pathlib.Path], archive: pathlib.Path) -> list[str]:
  """Writes the archive entries of the finished runs of `csv_paths` not yet in `archive`;
  returns their run ids. Raises on a run id the study does not plan."""
  planned = {item.run.run_id: item for item in repro.PLAN.runs()}
  metrics = run_status.spec_metrics(repro.FIGURE)
  recovered = []
  for csv_path in csv_paths:
    with open(csv_path, newline="") as f:
      for line in csv.DictReader(f):
        if line["status"] != "finished" or line["run_id"] in recovered:
          continue
        item = planned.get(line["run_id"])
        if item is None:
          raise ValueError(f"{csv_path}: run {line['run_id']} is not in the study's plan.")
        target = archive_lib.archived_dir(archive, item.run)
        if target.exists():
          continue
        record = {"step": int(line["step"]),
                  **{m: float(line[m]) for m in metrics if line[m] != ""}}
        target.mkdir(parents=True)
        (target / "config.json").write_text(
            sweep_lib.load_config(item.run).to_json_best_effort(indent=2))
        (target / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        (target / RECOVERED_FILE).write_text(
            f"Recovered from {csv_path.name} (the report's CSV): the run's workdir was lost, "
            "only its final values survive (metrics.jsonl has one line).\n")
        archive_lib.link_sweep_dirs(archive, item)
        recovered.append(item.run.run_id)
  return recovered


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("csv", nargs="+", type=pathlib.Path)
  parser.add_argument("--archive", type=pathlib.Path, required=True)
  args = parser.parse_args()
  print(f"recovered {len(recover(args.csv, args.archive))} runs into {args.archive}")


if __name__ == "__main__":
  main()
