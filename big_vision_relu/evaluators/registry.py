"""Builds the evaluators named in `config.evals` and decides when each one runs.

`config.evals.<name>.type` names the evaluator class; its other keys are the evaluator's own
plus the cadence `log_steps | log_epochs | log_examples | log_percent` (default: only the
first and last step). Every evaluator also runs at the first and the last step of a run.
Metrics are logged as `<name>/<metric>`. Each evaluator class is built as
`cls(config.evals.<name>, model=..., mesh=..., data_axis=..., default_loss=...)`: it is given
the run's model (and applies it as it needs: `common.make_predict_fn` for a model output).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax

from big_vision_relu import config as cfg_lib
from big_vision_relu.evaluators.attention_stats import AttentionStatsEvaluator
from big_vision_relu.evaluators.classification import ClassificationEvaluator
from big_vision_relu.evaluators.fewshot_evaluator import FewShotEvaluator

EVALUATORS: dict[str, type] = {
    "classification": ClassificationEvaluator,
    "fewshot": FewShotEvaluator,
    "attention_stats": AttentionStatsEvaluator,
}


class ScheduledEvaluator:
  """An evaluator with its name and cadence: `due(step)`, `run(params) -> {metric: value}`."""

  def __init__(self, name: str, evaluator: Any, every: int | None, total_steps: int):
    self.name, self._evaluator, self._every, self._total = name, evaluator, every, total_steps

  def due(self, step: int) -> bool:
    return step in (1, self._total) or bool(self._every and step % self._every == 0)

  def run(self, params: Any) -> dict[str, float]:
    return self._evaluator.run(params)


def from_config(evals: Mapping[str, Any], *, model: nn.Module, mesh: jax.sharding.Mesh,
                data_axis: str, total_steps: int, steps_per_epoch: float, train_batch_size: int,
                default_loss: str) -> list[ScheduledEvaluator]:
  """Instantiates every evaluator of `config.evals` (validating its keys and its data now)."""
  result = []
  for name, cfg in evals.items():
    kind = cfg.get("type")
    if kind not in EVALUATORS:
      raise ValueError(f"evals.{name}.type={kind!r}; valid: {', '.join(EVALUATORS)}.")
    cls = EVALUATORS[kind]
    cfg_lib.check_keys(f"evals.{name}", cfg, (*cls.CONFIG_KEYS, *cfg_lib.duration_keys("log")))
    every = cfg_lib.get_steps(cfg, "log", total_steps=total_steps,
                              steps_per_epoch=steps_per_epoch, batch_size=train_batch_size)
    evaluator = cls(cfg, model=model, mesh=mesh, data_axis=data_axis, default_loss=default_loss)
    result.append(ScheduledEvaluator(name, evaluator, every, total_steps))
  return result
