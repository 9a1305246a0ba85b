r"""Sweeps: a figure's list of runs, each a config with arguments, under a stable id.

A sweep file (configs/paper/fig*.py) defines `get_sweep() -> list[Run]`. A run's id is made from
its config and arguments only, so it never changes when runs are added or reordered, and it
names the run's workdir: `<workdir_root>/runs/<run id>`, one per run id whichever sweeps list
it (Figure 3's qk-LN-on half and Figure 1's S runs are Figure 2's runs: trained once, found by
every figure's report; `launch/tpu/sweep.sh` writes the same paths).

    python -m big_vision_relu.experiments.sweep configs/paper/fig2.py --list
    python -m big_vision_relu.experiments.sweep configs/paper/fig2.py \
        --run i21k-S16-relu-a1-qkln --workdir_root DIR
"""
from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
from absl import app, flags


def _short(key: str, value: Any) -> str:
  if isinstance(value, bool):
    return key if value else f"no{key}"
  if key == "variant":
    return str(value).replace("/", "")
  if key == "alpha":
    return f"a{value:g}"
  if key == "patch":  # bare numbers would be ambiguous
    return f"p{value}"
  if key == "seed":
    return f"seed{value}"
  if key == "epochs":
    return f"e{value}"
  if key == "lr":
    return f"lr{value:g}"
  if key == "validation":
    return f"val{value}"
  if key == "eval_points":
    return f"ev{value}"
  if key == "wd":
    return f"wd{value:g}"
  if key == "crop":
    return f"crop{value}"
  if key == "train_images":
    return f"train{value}"
  return str(value)


# The repository: `Run.config` paths are relative to it (the trainer runs with its checkout, or
# a study's pinned worktree, as its working directory).
REPO = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a sweep: `config` (a path relative to the repository) with `args`.

  `implicit` maps arguments to the config's own defaults: an argument at that value is left out
  of the run id and of --config (it trains the same), so a study can add an argument to its
  grid without renaming the runs it has finished.
  """
  config: str
  args: Mapping[str, Any]
  implicit: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def _spelled(self) -> dict[str, Any]:
    return {k: v for k, v in self.args.items() if k not in self.implicit or v != self.implicit[k]}

  @property
  def config_arg(self) -> str:
    """The value of --config: 'configs/vit_i21k.py:variant=S/16,attention=relu,...'."""
    return self.config + ":" + ",".join(f"{k}={v}" for k, v in self._spelled().items())

  @property
  def run_id(self) -> str:
    """e.g. 'i21k-S16-relu-a1-qk_norm-nogated' for vit_i21k.py with those args."""
    stem = pathlib.Path(self.config).stem.removeprefix("vit_")
    return "-".join([stem, *(_short(k, v) for k, v in self._spelled().items())])


@dataclasses.dataclass(frozen=True)
class Grid:
  """A study's runs: one config with every study argument spelled out, in the order of
  `defaults`, so that a run shared by several figures has one run id and is trained once;
  arguments at their `implicit` value (the config's default; see `Run`) are left unspelled."""
  config: str
  defaults: Mapping[str, Any]
  implicit: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def run(self, **args: Any) -> Run:
    """The run with `args` overriding the defaults. Softmax takes no alpha, so its alpha is
    always the default's (one run id)."""
    unknown = set(args) - set(self.defaults)
    if unknown:
      raise ValueError(f"Unknown study arguments {sorted(unknown)}; valid: "
                       f"{list(self.defaults)}.")
    values = {**self.defaults, **args}
    if values.get("attention") == "softmax":
      values["alpha"] = self.defaults["alpha"]
    return Run(self.config, values, self.implicit)

  def ablation(self, flag: str, alphas: Sequence[float], **panels: Sequence[Any]) -> list[Run]:
    """Figures 3 and 4: relu and relu2 at each of `alphas` with `flag` ('qk_norm' or 'gated')
    on and off, for every combination of the `panels` arguments' values (e.g.
    `variant=("S/32", "S/16")`, the figure's columns); the other arguments at their defaults."""
    return [self.run(**dict(zip(panels, values, strict=True)), attention=attention, alpha=alpha,
                     **{flag: on})
            for values in itertools.product(*panels.values())
            for attention in ("relu", "relu2") for alpha in alphas for on in (True, False)]


@dataclasses.dataclass(frozen=True)
class FigureSpec:
  """What a sweep's figure plots; a sweep file may set `FIGURE = FigureSpec(...)` (the
  default is the paper's). `panel_key` is the run argument that makes the columns of Figures
  2-4, `panel_title` formats a column's title from it; `size_key` is the run argument that
  labels Figure 1's points (the model size)."""
  accuracy_metric: str = "i1k/prec@1"
  accuracy_label: str = "ImageNet-1k accuracy"
  fewshot_metric: str = "fewshot/10shot_avg"
  fewshot_label: str = "10-shot linear transfer (avg of 8)"
  core_hours_label: str = "TPU core hours"
  panel_key: str = "variant"
  panel_title: str = "{dataset} {value}"
  size_key: str = "variant"


PAPER_FIGURE = FigureSpec()


def _load_module(path: str):
  spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config_file(config_arg: str) -> ml_collections.ConfigDict:
  """The config that `--config config_arg` ("file.py:args" or "file.py"; a relative path is the
  repository's, as in `Run.config`) gives the trainer."""
  path, _, arg = config_arg.partition(":")
  module = _load_module(str(REPO / path))
  return module.get_config(arg) if arg else module.get_config()


def load_config(run: Run) -> ml_collections.ConfigDict:
  """The run's training config, as `--config run.config_arg` gives it to the trainer."""
  return load_config_file(run.config_arg)


def checked_runs(runs: Sequence[Run], name: str) -> list[Run]:
  """`runs` (of the sweep `name`) as a list; raises ValueError on duplicate run ids."""
  ids = [r.run_id for r in runs]
  duplicates = sorted({i for i in ids if ids.count(i) > 1})
  if duplicates:
    raise ValueError(f"{name}: duplicate run ids {duplicates}.")
  return list(runs)


def load_sweep(path: str) -> list[Run]:
  """The runs of a sweep file; raises ValueError on duplicate run ids."""
  return checked_runs(_load_module(path).get_sweep(), path)


def load_figure_spec(path: str) -> FigureSpec:
  """The sweep file's `FIGURE`, or the paper's spec when it sets none."""
  figure = getattr(_load_module(path), "FIGURE", PAPER_FIGURE)
  if not isinstance(figure, FigureSpec):
    raise TypeError(f"{path}: FIGURE must be a sweep.FigureSpec, got {type(figure).__name__}.")
  return figure


def sweep_name(path: str) -> str:
  return pathlib.Path(path).stem


def workdir(root: str, run: Run) -> str:
  """`<root>/runs/<run id>`: the same for every sweep listing the run, so it trains once."""
  return f"{root.rstrip('/')}/runs/{run.run_id}"


def sweep_link(root: str, path: str, run: Run) -> str:
  """`<root>/<sweep name>/<run id>` (`path`: a sweep file, or a sweep's name): where a local
  archive links the run for browsing."""
  return f"{root.rstrip('/')}/{sweep_name(path)}/{run.run_id}"


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    raise app.UsageError("Usage: python -m big_vision_relu.experiments.sweep SWEEP_FILE "
                         "(--list | --run ID --workdir_root DIR)")
  path = argv[1]
  runs = load_sweep(path)
  if FLAGS.list:
    for run in runs:
      print(f"{run.run_id}\t{run.config_arg}")
    return
  if not FLAGS.run or not FLAGS.workdir_root:
    raise app.UsageError("Pass --list, or --run ID with --workdir_root DIR.")
  by_id = {r.run_id: r for r in runs}
  if FLAGS.run not in by_id:
    raise app.UsageError(f"No run {FLAGS.run!r} in {path}; see --list.")
  run = by_id[FLAGS.run]
  command = [sys.executable, "-m", "big_vision_relu.train", "--config", run.config_arg,
             "--workdir", workdir(FLAGS.workdir_root, run)]
  print(" ".join(command), flush=True)
  sys.exit(subprocess.call(command, env=os.environ))


if __name__ == "__main__":
  # Defined here, not at import: sweep files import this module (for Run) while it runs.
  FLAGS = flags.FLAGS
  flags.DEFINE_bool("list", False, "Print '<run id>\\t<--config value>' per run.")
  flags.DEFINE_string("run", None, "Run the run with this id (python -m big_vision_relu.train "
                      "in this process's environment).")
  flags.DEFINE_string("workdir_root", None, "Workdirs are ROOT/runs/<run id>.")
  app.run(main)
