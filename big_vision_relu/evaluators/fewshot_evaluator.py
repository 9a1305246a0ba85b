"""Few-shot linear transfer during training: embed datasets with the model, then ridge probes.

Config (under `evals.<name>`, type='fewshot'; `FewShotEvaluator.CONFIG_SCHEMA` has each key's
default and check):
  datasets   {short_name: (tfds_name, train_split, test_split)}, e.g. configs/common.py's
             FEWSHOT_8 (the paper's 8 datasets) or {'digits': ('digits', 'train', 'test')}
  data_dir   optional TFDS data dir of those datasets
  pp_train, pp_eval   pp strings producing `image` and an integer `label` (deterministic)
  shots (10,), seeds (0, 1, 2), l2_reg 2**10, loo_l2_grid (2^-10 .. 2^20)
  pred       the representation, a key of the model's `out` (default 'pre_logits')
  batch_size the global batch of the embedding
Metrics: those of `fewshot.fewshot_results` per dataset and `fewshot.fewshot_average` over them
(`10shot_avg` is the paper's "average 10-shot linear transfer on 8 datasets").

Features of the whole train and test splits are gathered on every host (they are small:
[N, width]) and put back in the split's order, so the probe sees the same examples in the same
order whatever the number of hosts; every host computes the same numbers.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils

from big_vision_relu import config as cfg_lib
from big_vision_relu.data import batching
from big_vision_relu.data import inputs
from big_vision_relu.evaluators import common
from big_vision_relu.evaluators import fewshot


def embed_split(embed: Callable[[Any, Mapping[str, jax.Array]], jax.Array], params: Any,
                data: inputs.EvalData) -> tuple[np.ndarray, np.ndarray]:
  """([N, D] float64 features, [N] int labels) of a whole split, in the split's order.

  `embed(params, batch) -> [b, ...]` maps a global batch (its `image`) to features; the pp
  must produce `image` and an integer `label`. Every host gets all N rows.
  """
  parts = []
  for batch in data:
    values = (embed(params, batch), batch["label"], batch[batching.MASK_KEY],
              batch[batching.RECORD_KEY])
    parts.append([np.asarray(v) for v in multihost_utils.process_allgather(values, tiled=True)])
  feats, labels, mask, records = (np.concatenate(p) for p in zip(*parts))
  order = np.argsort(records[mask], kind="stable")
  return (feats[mask][order].reshape(int(mask.sum()), -1).astype(np.float64),
          labels[mask][order].astype(np.int64))


def _is_dataset_specs(value: Any) -> bool:
  return isinstance(value, Mapping) and bool(value) and all(
      isinstance(spec, (list, tuple)) and len(spec) == 3
      and all(isinstance(part, str) for part in spec) for spec in value.values())


def _tuple_of(requirement: str, test: Callable[[Any], bool]) -> cfg_lib.Check:
  """Checks for a non-empty tuple (or list) whose items pass `test`."""
  return cfg_lib.check_that(requirement, lambda v: isinstance(v, (list, tuple)) and bool(v)
                            and all(map(test, v)))


def _is_positive_number(value: Any) -> bool:
  return cfg_lib.is_number(value) and value > 0


def _is_seed(value: Any) -> bool:  # np.random.default_rng's: an int >= 0
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class FewShotEvaluator:
  """k-shot ridge probes of a representation on several datasets (see the module docstring).

  `config` is filled and checked against `CONFIG_SCHEMA` (`registry.evaluator_config`).
  """
  CONFIG_SCHEMA: cfg_lib.Schema = {
      "datasets": cfg_lib.Key(None, cfg_lib.check_that(
          "a non-empty dict {short_name: (tfds_name, train_split, test_split)}, e.g. "
          "{'digits': ('digits', 'train', 'test')}", _is_dataset_specs, required=True)),
      "data_dir": cfg_lib.Key(None),  # None: TFDS's default (datasets.get_builder)
      "pp_train": common.pp_key("`image` and an integer `label`"),
      "pp_eval": common.pp_key("`image` and an integer `label`"),
      "shots": cfg_lib.Key((10,), _tuple_of(
          "a non-empty tuple of positive ints (examples per class), e.g. (1, 5, 10)",
          cfg_lib.is_positive_int)),
      "seeds": cfg_lib.Key((0, 1, 2), _tuple_of(
          "a non-empty tuple of ints >= 0 (one subset per seed), e.g. (0, 1, 2)", _is_seed)),
      "l2_reg": cfg_lib.Key(fewshot.DEFAULT_L2, cfg_lib.check_that(
          "a finite number > 0 (the ridge penalty), e.g. 1024.0", _is_positive_number)),
      "loo_l2_grid": cfg_lib.Key(fewshot.DEFAULT_LOO_L2_GRID, _tuple_of(
          "a non-empty tuple of finite numbers > 0 (the l2s leave-one-out picks from)",
          _is_positive_number)),
      "pred": common.pred_key("pre_logits"),
      "batch_size": common.BATCH_SIZE_KEY,
  }

  def __init__(self, config: Mapping[str, Any], *, model: nn.Module, mesh: jax.sharding.Mesh,
               data_axis: str | tuple[str, ...] = "data", pipeline: str,
               default_loss: str | None = None):
    del default_loss  # a probe has no training loss
    self.shots = tuple(config["shots"])
    self.seeds = tuple(config["seeds"])
    self.l2_reg = float(config["l2_reg"])
    self.loo_l2_grid = tuple(config["loo_l2_grid"])
    data_dir = config["data_dir"]
    self.datasets = {}
    for short_name, (tfds_name, train_split, test_split) in dict(config["datasets"]).items():
      # Fails now, with the command that prepares the dataset, not after hours of training.
      self.datasets[short_name] = tuple(
          inputs.EvalData({"name": tfds_name, "split": split, "data_dir": data_dir}, pp,
                          config["batch_size"], pipeline=pipeline, mesh=mesh,
                          data_axis=data_axis)
          for split, pp in ((train_split, config["pp_train"]), (test_split, config["pp_eval"]))
      ) + (inputs.num_classes(tfds_name, data_dir, pipeline),)

    predict_fn = common.make_predict_fn(model, config["pred"])

    def embed(params, batch):
      return predict_fn(params, batch["image"])
    self._embed = jax.jit(embed)

  def run(self, params: Any) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for short_name, (train, test, num_classes) in self.datasets.items():
      x_train, y_train = embed_split(self._embed, params, train)
      x_test, y_test = embed_split(self._embed, params, test)
      metrics.update(fewshot.fewshot_results(
          x_train, y_train, x_test, y_test, name=short_name, num_classes=num_classes,
          shots=self.shots, seeds=self.seeds, l2_reg=self.l2_reg,
          loo_l2_grid=self.loo_l2_grid))
    metrics.update(fewshot.fewshot_average(metrics, list(self.datasets), shots=self.shots))
    return metrics
