"""A workdir belongs to one config: a re-run with another config stops before writing anything.

Re-running a training command resumes from the workdir's checkpoints, so a different config
pointed at an existing workdir (a typo in --workdir, two configs sharing a default workdir)
would silently continue another run and relabel its metrics. The trainer calls `use_config`
first: it compares the new config with the workdir's `config.json` and stops, naming every
differing key, unless the change is deliberate (`--allow_config_change`, e.g. more steps).

The workdir keeps `config.json` (the config of its latest start) and `config_history.jsonl`:
one line per config it was run with, `{"time": ISO-8601 UTC, "config": {...}, "changes":
["key: old -> new", ...]}` (time null for the config of a workdir written before the history).

It also keeps `data_dir.json`, `{"tfds_data_dir": DIR}`: the TFDS data dir the run read its
datasets from where the config names none (`TFDS_DATA_DIR` on a TPU VM, as launch/tpu sets it,
else TFDS's default), written at each start (`record_data_dir`), so that tools that open the
run elsewhere (the Colab notebook: `recorded_data_dir`) find its data.
"""
from __future__ import annotations

import datetime
import json
import os
from typing import Any

import ml_collections
from etils import epath

from big_vision_relu import config as cfg_lib

CONFIG_NAME = "config.json"
HISTORY_NAME = "config_history.jsonl"
DATA_DIR_NAME = "data_dir.json"


def record_data_dir(workdir: epath.PathLike) -> str:
  """Writes `<workdir>/data_dir.json` (see the module docstring); returns the data dir.

  The data dir as TFDS resolves it for a dataset without its own `data_dir`: env
  `TFDS_DATA_DIR`, else `~/tensorflow_datasets` (tfds.core.constants, read here without
  importing TFDS)."""
  data_dir = os.environ.get("TFDS_DATA_DIR") or os.path.join(os.path.expanduser("~"),
                                                             "tensorflow_datasets")
  (epath.Path(workdir) / DATA_DIR_NAME).write_text(json.dumps({"tfds_data_dir": data_dir}))
  return data_dir


def recorded_data_dir(workdir: epath.PathLike) -> str | None:
  """The data dir `record_data_dir` wrote for the run in `workdir`; None for a workdir
  written before it did."""
  path = epath.Path(workdir) / DATA_DIR_NAME
  return json.loads(path.read_text())["tfds_data_dir"] if path.exists() else None


def read_config(workdir: epath.PathLike) -> ml_collections.ConfigDict:
  """The config a run wrote to `<workdir>/config.json` (what `evaluate` and `inspect` rebuild
  the run from)."""
  path = epath.Path(workdir) / CONFIG_NAME
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: is {workdir} a training workdir? Pass "
                            "--config to evaluate with an explicit config.")
  return ml_collections.ConfigDict(json.loads(path.read_text()))


class ConfigChangedError(ValueError):
  """The workdir holds a run with another config, and the change was not allowed."""


def use_config(workdir: epath.PathLike, config_json: str, *, allow_change: bool,
               write: bool) -> list[tuple[str, Any, Any]]:
  """Checks `config_json` (the new config, `to_json_best_effort`) against `workdir`'s
  config.json; returns the changes (empty for a new workdir or the same config).

  Every process of a multi-host run calls this (all of them read config.json, so all raise
  alike); only the one with `write` (process 0) creates the workdir and records the config.
  Raises ConfigChangedError, before anything is written, if the configs differ and not
  `allow_change`.
  """
  workdir = epath.Path(workdir)
  path = workdir / CONFIG_NAME
  new = json.loads(config_json)
  old = json.loads(path.read_text()) if path.exists() else None
  changes = [] if old is None else cfg_lib.config_changes(old, new)
  if changes and not allow_change:
    raise ConfigChangedError(
        f"{workdir} holds a run with another config: {len(changes)} key(s) differ "
        f"(its {CONFIG_NAME} -> this config):\n{cfg_lib.format_changes(changes)}\n"
        "Nothing was written. Give this run a workdir of its own, or, to continue that run "
        "with this config (e.g. more steps), pass --allow_config_change "
        f"(train(..., allow_config_change=True)); {HISTORY_NAME} then keeps both configs.")
  if write and (old is None or changes):
    workdir.mkdir(parents=True, exist_ok=True)
    history = workdir / HISTORY_NAME
    lines = history.read_text() if history.exists() else ""
    if old is not None and not lines:  # a workdir from before the history: keep its config
      lines += json.dumps({"time": None, "config": old}) + "\n"
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    described = cfg_lib.format_changes(changes).splitlines()
    lines += json.dumps({"time": now, "config": new,
                         "changes": [line.strip() for line in described]}) + "\n"
    history.write_text(lines)
    # Other processes may be reading config.json: replace it whole, never half-written.
    partial = workdir / f"{CONFIG_NAME}.partial"
    partial.write_text(config_json)
    partial.replace(path)
  return changes
