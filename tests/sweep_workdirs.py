"""Fabricated sweep workdirs for the report's tests (test_report.py, test_report_seeds.py)."""
import json
import pathlib
from typing import Any

from big_vision_relu.experiments import sweep


def steps_config(total: int) -> dict[str, Any]:
  """A config.json whose run trains `total` steps."""
  return {"total_steps": total, "input": {"batch_size": 8, "data": {"name": "x", "split": "y"}}}


def write_run(root: pathlib.Path, run: sweep.Run,
              lines: list[dict[str, Any]] | None, config: dict[str, Any] | None) -> None:
  """`run`'s workdir under `root` with these metrics.jsonl lines and config.json (None: no file)."""
  workdir = pathlib.Path(sweep.workdir(str(root), run))
  workdir.mkdir(parents=True)
  if config is not None:
    (workdir / "config.json").write_text(json.dumps(config, indent=2))
  if lines is not None:
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def collections(ax, gid: str) -> list:
  """The artists of a matplotlib Axes' collections with this gid."""
  return [c for c in ax.collections if c.get_gid() == gid]
