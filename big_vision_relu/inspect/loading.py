"""Runs to inspect: a training workdir's checkpoint (with its config and metrics) or a
big_vision `.npz`."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from big_vision_relu import checkpoint as checkpoint_lib
from big_vision_relu import metrics as metrics_lib
from big_vision_relu import run as run_lib
from big_vision_relu import workdir_config
from big_vision_relu.evaluators import attention_capture
from big_vision_relu.models import vit


@dataclasses.dataclass(frozen=True)
class Run:
  """A model with its parameters: a training run's checkpoint or a big_vision `.npz`."""
  model: vit._Model  # noqa: SLF001
  params: Any  # nested dict of arrays (scan layout if model.scan)
  config: ml_collections.ConfigDict | None  # the run's config.json (None for an .npz)
  step: int | None  # the checkpoint's step (None for an .npz)
  source: str  # the workdir or .npz path

  @property
  def name(self) -> str:
    """A short label for tables and figures: the workdir's (or file's) name."""
    return epath.Path(self.source).name

  @functools.cached_property
  def forward(self) -> Callable[[Any, jax.Array], dict[str, Any]]:
    """`attention_capture.apply_inspecting` of this run's model, jitted:
    (params, images) -> dict."""
    return jax.jit(functools.partial(attention_capture.apply_inspecting, self.model))


def data_dir(run: Run) -> str | None:
  """The TFDS data dir the run's trainer read (its workdir's data_dir.json: TFDS_DATA_DIR on a
  TPU VM); None for an .npz or a workdir written before the trainer recorded it."""
  return None if run.config is None else workdir_config.recorded_data_dir(run.source)


def checkpoint_steps(workdir: str | epath.PathLike) -> list[int]:
  """The finalised checkpoint steps of a workdir, ascending (orbax writes a step atomically)."""
  directory = epath.Path(workdir) / "checkpoints"
  if not directory.exists():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def load_run(workdir: str | epath.PathLike, step: int | None = None) -> Run:
  """Loads a training workdir: `config.json`, the model it describes and a checkpoint's params.

  Args:
    workdir: the `--workdir` of `big_vision_relu.train` (local or gs://).
    step: the checkpoint step; None: the newest readable one (an unreadable newer step is
      skipped with a warning; nothing on disk is changed).
  Only the parameters are read (`checkpoint.read_params`), never the optimizer state.
  """
  config = workdir_config.read_config(workdir)
  model = run_lib.make_model(config)
  steps = checkpoint_steps(workdir)
  if step is not None and step not in steps:
    raise FileNotFoundError(f"No checkpoint step {step} in {workdir}/checkpoints; steps: "
                            f"{steps or 'none'}.")
  candidates = [step] if step is not None else steps[::-1]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  errors = []
  for candidate in candidates:
    try:
      params = checkpoint_lib.read_params(  # not the optimizer state
          epath.Path(workdir) / "checkpoints" / str(candidate),
          lambda abstract: jax.tree.map(lambda _: device, abstract))
    except (ValueError, OSError) as e:
      if step is not None:
        raise
      logging.warning("Could not read checkpoint step %d of %s (%s); trying an older one (any "
                      "'RuntimeError: Event loop is closed' printed around this: that step's "
                      "other reads; harmless).", candidate, workdir, e)
      errors.append(f"step {candidate}: {type(e).__name__}: {e}")
      continue
    return Run(model=model, params=params, config=config, step=candidate, source=str(workdir))
  raise FileNotFoundError(f"No readable checkpoint in {workdir}/checkpoints"
                          + (":\n" + "\n".join(errors) if errors else " (none written yet)."))


def load_npz(path: str, model_config: Mapping[str, Any], num_classes: int | None = None) -> Run:
  """Loads a big_vision-layout `.npz` for the ViT of `model_config` (`config.model` keywords).

  Args:
    path: local or gs:// `.npz` (e.g. one of big_vision's released ViTs, or `vit.save_npz`).
    model_config: keywords of `vit.Model`, e.g. {'variant': 'S/16', 'pool_type': 'map'}.
    num_classes: the head's classes; None: read from the file's `head/kernel` (no head: None).
  """
  model_config = dict(model_config)
  params = vit.load(None, path, model_config)
  if num_classes is None and "head" in params:
    num_classes = int(params["head"]["kernel"].shape[-1])
  model = vit.Model(num_classes, **model_config)
  model.validate()
  return Run(model=model, params=params, config=None, step=None, source=str(path))


def read_metrics(workdir: str | epath.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """`<workdir>/metrics.jsonl` as {metric: (steps [m] int, values [m] float)}, by step (read by
  `metrics.read_metrics`, which keeps the surviving run's lines of a resumed run)."""
  series: dict[str, tuple[list[int], list[float]]] = {}
  for step, record in metrics_lib.read_metrics(workdir).items():
    for name, value in record.items():
      steps, values = series.setdefault(name, ([], []))
      steps.append(step)
      values.append(float(value))
  return {name: (np.asarray(s), np.asarray(v)) for name, (s, v) in series.items()}
