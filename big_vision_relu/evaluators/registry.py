"""Builds the evaluators named in `config.evals` and decides when each one runs.

`config.evals.<name>.type` names the evaluator class; its other keys are the evaluator's own
(its class's `CONFIG_SCHEMA`: each key's default and check) plus the cadence
`log_steps | log_epochs | log_examples | log_percent` (default: only the first and last step).
`evaluator_config` fills and checks one evaluator's config; `from_config` checks them all before
any evaluator reads its data. Every evaluator also runs at the first and the last step of a run.
Metrics are logged as `<name>/<metric>`. Each evaluator class is built as
`cls(filled config, model=..., mesh=..., data_axis=..., pipeline=..., default_loss=...)`: it is
given the run's model (and applies it as it needs: `common.make_predict_fn` for a model output)
and reads its data through the run's input pipeline (`data.inputs.EvalData`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from big_vision_relu import config as cfg_lib
from big_vision_relu.evaluators.attention_stats import AttentionStatsEvaluator
from big_vision_relu.evaluators.classification import ClassificationEvaluator
from big_vision_relu.evaluators.fewshot_evaluator import FewShotEvaluator

EVALUATORS: dict[str, type] = {
    "classification": ClassificationEvaluator,
    "fewshot": FewShotEvaluator,
    "attention_stats": AttentionStatsEvaluator,
}
CADENCE_SCHEMA: cfg_lib.Schema = cfg_lib.duration_schema("log")  # at most one (get_steps)


def evaluator_config(config: Mapping[str, Any], where: str) -> ml_collections.ConfigDict:
  """`config` (one evaluator's, named `where`, e.g. 'evals.test') with every key of its type's
  `CONFIG_SCHEMA` and of the cadence: unset keys take their default, every value is checked.
  Raises ValueError naming the key for an unknown type or key, a missing or bad value."""
  if not isinstance(config, (Mapping, ml_collections.ConfigDict)):
    raise ValueError(f"{where} must be a dict with a 'type' ({', '.join(EVALUATORS)}), got "
                     f"{type(config).__name__}: {config!r}.")
  kind = config.get("type")
  if kind not in EVALUATORS:
    raise ValueError(f"{where}.type={kind!r}; valid: {', '.join(EVALUATORS)}.")
  schema = {"type": cfg_lib.Key(),  # checked above: it picks the schema
            **EVALUATORS[kind].CONFIG_SCHEMA, **CADENCE_SCHEMA}
  return cfg_lib.fill_defaults(config, schema, where)


class ScheduledEvaluator:
  """An evaluator with its name and cadence: `due(step)`, `run(params) -> {metric: value}`."""

  def __init__(self, name: str, evaluator: Any, every: int | None, total_steps: int | None):
    self.name, self._evaluator, self._every, self._total = name, evaluator, every, total_steps

  def due(self, step: int) -> bool:
    return step in (1, self._total) or bool(self._every and step % self._every == 0)

  def run(self, params: Any) -> dict[str, float]:
    return self._evaluator.run(params)


def from_config(evals: Mapping[str, Any], *, model: nn.Module, mesh: jax.sharding.Mesh,
                data_axis: str, pipeline: str, total_steps: int | None,
                steps_per_epoch: float | None, train_batch_size: int,
                default_loss: str) -> list[ScheduledEvaluator]:
  """Instantiates every evaluator of `config.evals`: checks every config and cadence first,
  then builds each evaluator (which checks its data now). `total_steps` None: no cadence
  (evaluating a checkpoint runs each evaluator once)."""
  configs = {name: evaluator_config(cfg, f"evals.{name}") for name, cfg in evals.items()}
  every = {name: None if total_steps is None else cfg_lib.get_steps(
               cfg, "log", total_steps=total_steps, steps_per_epoch=steps_per_epoch,
               batch_size=train_batch_size, where=f"evals.{name}")
           for name, cfg in configs.items()}
  result = []
  for name, cfg in configs.items():
    evaluator = EVALUATORS[cfg.type](cfg, model=model, mesh=mesh, data_axis=data_axis,
                                     pipeline=pipeline, default_loss=default_loss)
    result.append(ScheduledEvaluator(name, evaluator, every[name], total_steps))
  return result
