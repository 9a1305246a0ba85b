"""A study as the core sees it: its `Plan`, found by name among the units of
experiments/studies/.

A study is one unit of `big_vision_relu/experiments/studies/`: a module, or a package when it
has several (its rules, its report), that sets `PLAN = plans.Plan(...)`: its grid (named
sweeps, each a function listing its runs), its run order (phases), the datasets its runs read,
whether its trainers are pinned to a commit, which phases its own rules let train now, and its
report. The core (`study`: training, status, parking; `report`; launch/study.sh) reaches a study
only through `load(name)`, and lists them with `names()`: adding a study is adding a unit, and
the core never names one.

A phase is (sweep name, {argument: value or tuple of values}): that sweep's runs whose
arguments have those values. The plan's runs (`Plan.runs`) are its phases' runs in phase order,
each once (a run shared by several sweeps is trained once, in `<root>/runs/<run id>`) with every
sweep that lists it.
"""
from __future__ import annotations

import dataclasses
import importlib
import pathlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from big_vision_relu.experiments import sweep as sweep_lib

STUDIES = "big_vision_relu.experiments.studies"  # the package of the units
_STUDIES_DIR = pathlib.Path(__file__).with_name("studies")

Phase = tuple[str, Mapping[str, Any]]
Sweeps = Mapping[str, Callable[[], Sequence[sweep_lib.Run]]]  # sweep name -> its runs


@dataclasses.dataclass(frozen=True)
class PlannedRun:
  run: sweep_lib.Run
  phase: int  # index into the phases
  sweeps: tuple[str, ...]  # the name of every sweep that lists it


@dataclasses.dataclass(frozen=True)
class Plan:
  """One study: what the core trains, in which order, and how it reports.

  `gate(archive)`: the indices of the phases its rules let train now, judged on the archive
  (None: all), with why, in the order their runs take workers (a phase's runs start only once
  every run before it in that order has a worker). `report`: the dotted name of the unit's module whose
  `write(archive, out) -> path` writes the study's own report (its verdicts) into the directory
  `out` and returns the path of its main page; the core imports it only to report (it may draw
  with matplotlib, which the study runner never loads); None: the study has no report of its
  own (yet).
  """
  name: str  # the unit's name: `--plan`, launch/study.sh's first argument
  sweeps: Sweeps
  phases: Sequence[Phase]
  datasets: tuple[str, ...]  # what `python -m big_vision_relu.data.prepare` builds for it
  docs: str  # where its report goes (repository-relative)
  data_packages: tuple[str, ...] = ()  # Debian packages holding its datasets' files
  pinned: bool = True  # its trainers run from a worktree at the study's commit
  figures: tuple[str, ...] = ()  # sweeps drawn as the paper's Figures 1-4 (experiments.report)
  figure: sweep_lib.FigureSpec = sweep_lib.PAPER_FIGURE  # what those tables and figures plot
  gate: Callable[[pathlib.Path], tuple[tuple[int, ...], str] | None] | None = None
  report: str | None = None

  def sweep(self, name: str) -> list[sweep_lib.Run]:
    """The runs of sweep `name`; raises ValueError for an unknown name or duplicate run ids."""
    return sweep_runs(self.sweeps, name)

  def runs(self, phases: Sequence[Phase] | None = None) -> list[PlannedRun]:
    """`plan` of these phases (default: all of the study's)."""
    return plan(self.sweeps, self.phases if phases is None else phases)


def sweep_runs(sweeps: Sweeps, name: str) -> list[sweep_lib.Run]:
  """The runs of `sweeps[name]`; raises ValueError for an unknown name or duplicate run ids."""
  if name not in sweeps:
    raise ValueError(f"No sweep {name!r}; the study's sweeps are {list(sweeps)}.")
  return sweep_lib.checked_runs(sweeps[name](), name)


def plan(sweeps: Sweeps, phases: Sequence[Phase]) -> list[PlannedRun]:
  """The runs of `phases` in phase order, each once, with all the sweeps (of those the phases
  name) that list it."""
  runs = {name: sweep_runs(sweeps, name) for name in dict.fromkeys(name for name, _ in phases)}
  listed_by: dict[str, list[str]] = {}
  for name, listed in runs.items():
    for run in listed:
      listed_by.setdefault(run.run_id, []).append(name)
  planned: dict[str, PlannedRun] = {}
  for index, (name, selection) in enumerate(phases):
    for run in runs[name]:
      unknown = set(selection) - set(run.args)
      if unknown:
        raise ValueError(f"Phase {index} ({name}) selects on {sorted(unknown)}, which its runs "
                         f"do not have; they have {list(run.args)}.")
      if run.run_id not in planned and all(
          run.args[k] in v if isinstance(v, tuple) else run.args[k] == v
          for k, v in selection.items()):
        planned[run.run_id] = PlannedRun(run, index, tuple(listed_by[run.run_id]))
  return list(planned.values())


def names() -> list[str]:
  """The studies: the units (modules and packages) of experiments/studies/, by name."""
  return sorted(unit.name for unit in pkgutil.iter_modules([str(_STUDIES_DIR)]))


def load(name: str) -> Plan:
  """The `PLAN` of the unit `name` of experiments/studies/; raises ValueError naming the
  studies there if there is no such unit, TypeError if it sets no Plan of that name."""
  if name not in names():
    raise ValueError(f"No study {name!r}; the studies are {', '.join(names())} "
                     f"({_STUDIES_DIR}).")
  unit = importlib.import_module(f"{STUDIES}.{name}")
  found = getattr(unit, "PLAN", None)
  if not isinstance(found, Plan) or found.name != name:
    raise TypeError(f"{unit.__file__} must set PLAN = plans.Plan(name={name!r}, ...).")
  return found
