"""Where and how a study's runs were trained: the records the study keeps beside each run.

- `<workdir>/launches.jsonl` (LAUNCHES_FILE), one line per start of a run's trainer: when, the
  step it resumed from, the CPU it ran on (since 2026-11-25), the environment that sets its
  speed, not its results (SPEED_ENV), and the kernel's transparent huge page mode (since
  2026-11-25 21:20 UTC; it too sets only the speed). Archived with the run.
- `<archive>/runs/<run id>/provenance.json` (PROVENANCE_FILE): the pinned commit and the machine
  of the study that finished the run.

XLA:CPU compiles for the CPU it runs on, so two CPU models give results that differ at rounding
level (docs/reproduction.md 1.4): a run resumed on another model says so here.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import time
from collections.abc import Mapping
from typing import Any

from big_vision_relu import multihost

PROVENANCE_FILE = "provenance.json"  # in each archived run
LAUNCHES_FILE = "launches.jsonl"  # in a run's workdir: one line per trainer start
SPEED_ENV = ("LD_PRELOAD", "GLIBC_TUNABLES")  # recorded at each start of a trainer
THP_FILE = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


def cpu_model() -> str:
  """This machine's CPU model name (/proc/cpuinfo), 'unknown' where it has none."""
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return "unknown"


def transparent_hugepages(path: pathlib.Path = THP_FILE) -> str:
  """The kernel's transparent huge page mode, the bracketed word of `path` ('always', 'madvise'
  or 'never'; 'unknown' where there is none). Under 'always' the trainers' tcmalloc heap gets
  2 MiB pages, which no allocator of theirs asks for (docs/benchmarks.md section 3)."""
  try:
    match = re.search(r"\[(\w+)\]", path.read_text())
  except OSError:
    return "unknown"
  return match.group(1) if match else "unknown"


def machine() -> dict[str, Any]:
  """What this machine is, for the provenance of the runs finished on it."""
  import jax  # pylint: disable=g-import-not-at-top  (the study itself needs no accelerator)
  return {"cpu": cpu_model(), "cores": os.cpu_count(), "jax_backend": jax.default_backend(),
          "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__}


def record_launch(workdir: pathlib.Path, env: Mapping[str, str]) -> None:
  """Appends to `workdir`/LAUNCHES_FILE, as a trainer starts in it with environment `env`, the
  step it resumes from, the CPU, SPEED_ENV and the transparent huge page mode, so each run's
  core hours can be read for what they are and a run resumed on another machine says so."""
  line = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "resumes_from_step": multihost.latest_finalized_step(workdir / "checkpoints") or 0,
          "cpu": cpu_model(), **{name: env.get(name, "") for name in SPEED_ENV},
          "transparent_hugepage": transparent_hugepages()}
  with open(workdir / LAUNCHES_FILE, "a") as f:
    f.write(json.dumps(line) + "\n")


def read_provenance(directory: pathlib.Path) -> dict[str, Any]:
  """An archived run's provenance.json ({} for a run archived without one)."""
  path = directory / PROVENANCE_FILE
  return json.loads(path.read_text()) if path.exists() else {}


def _short_cpu(cpu: str) -> str:
  return " ".join(cpu.replace("(R)", "").replace("Processor", "").split())


Starts = tuple[tuple[int | None, str], ...]


def starts(directory: pathlib.Path) -> Starts:
  """(step it resumed from, short CPU name) of each start of an archived run.

  Starts recorded before launches named their CPU get '?', except the last: the study that made
  it also finished the run, on the machine its provenance names. A run archived before launch
  records existed: ((None, the CPU that finished it),)."""
  finished_on = _short_cpu(read_provenance(directory).get("machine", {}).get("cpu", "?"))
  path = directory / LAUNCHES_FILE
  if not path.exists():
    return ((None, finished_on),)
  launches = [json.loads(line) for line in path.read_text().splitlines()]
  return tuple((x["resumes_from_step"], _short_cpu(x["cpu"]) if "cpu" in x else
                finished_on if i == len(launches) - 1 else "?")
               for i, x in enumerate(launches))


def describe(run_starts: Starts) -> str:
  """'AMD EPYC from 0, Intel Xeon from 8095', or 'finished on AMD EPYC' (`starts`).

  A resume on the same (known) CPU model as the start before it is folded into that start: the
  column says which CPU trained which steps, not how often the run was parked."""
  merged = [start for i, start in enumerate(run_starts)
            if i == 0 or start[1] == "?" or start[1] != run_starts[i - 1][1]]
  return ", ".join(f"finished on {cpu}" if step is None else f"{cpu} from {step}"
                   for step, cpu in merged) or "-"
