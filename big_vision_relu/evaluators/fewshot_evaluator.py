"""Few-shot linear transfer during training: embed datasets with the model, then ridge probes.

Config (under `evals.<name>`, type='fewshot'):
  datasets   {short_name: (tfds_name, train_split, test_split)}, e.g. configs/common.py's
             FEWSHOT_8 (the paper's 8 datasets) or {'digits': ('digits', 'train', 'test')}
  data_dir   optional TFDS data dir of those datasets
  pp_train, pp_eval   pp strings producing `image` and an integer `label` (deterministic)
  shots (10,), seeds (0, 1, 2), l2_reg 2**10, loo_l2_grid (2^-10 .. 2^20)
  pred       the representation, a key of the model's `out` (default 'pre_logits')
  batch_size
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

from big_vision_relu.data import datasets as datasets_lib
from big_vision_relu.data import input_pipeline
from big_vision_relu.evaluators import common
from big_vision_relu.evaluators import fewshot


def embed_split(embed: Callable[[Any, Mapping[str, jax.Array]], jax.Array], params: Any,
                data: Mapping[str, str], pp: str, batch_size: int, *, mesh: jax.sharding.Mesh,
                data_axis: str | tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
  """([N, D] float64 features, [N] int labels) of a whole split, in the split's order.

  `embed(params, batch) -> [b, ...]` maps a global batch (its `image`) to features; the pp
  must produce `image` and an integer `label`. Every host gets all N rows.
  """
  parts = []
  for batch in common.global_eval_batches(data, pp, batch_size, mesh=mesh,
                                          data_axis=data_axis):
    values = (embed(params, batch), batch["label"], batch[input_pipeline.MASK_KEY],
              batch[input_pipeline.RECORD_KEY])
    parts.append([np.asarray(v) for v in multihost_utils.process_allgather(values, tiled=True)])
  feats, labels, mask, records = (np.concatenate(p) for p in zip(*parts))
  order = np.argsort(records[mask], kind="stable")
  return (feats[mask][order].reshape(int(mask.sum()), -1).astype(np.float64),
          labels[mask][order].astype(np.int64))


class FewShotEvaluator:
  """k-shot ridge probes of a representation on several datasets (see the module docstring)."""
  CONFIG_KEYS = ("type", "datasets", "data_dir", "pp_train", "pp_eval", "shots", "seeds",
                 "l2_reg", "loo_l2_grid", "pred", "batch_size")

  def __init__(self, config: Mapping[str, Any], *, model: nn.Module, mesh: jax.sharding.Mesh,
               data_axis: str | tuple[str, ...] = "data", default_loss: str | None = None):
    del default_loss  # a probe has no training loss
    self.mesh, self.data_axis = mesh, data_axis
    self.batch_size = int(config["batch_size"])
    self.pp_train, self.pp_eval = config["pp_train"], config["pp_eval"]
    self.shots = tuple(config.get("shots", (10,)))
    self.seeds = tuple(config.get("seeds", (0, 1, 2)))
    self.l2_reg = float(config.get("l2_reg", fewshot.DEFAULT_L2))
    self.loo_l2_grid = tuple(config.get("loo_l2_grid", fewshot.DEFAULT_LOO_L2_GRID))
    data_dir = config.get("data_dir")
    self.datasets = {}
    for short_name, spec in dict(config["datasets"]).items():
      if len(spec) != 3:
        raise ValueError(f"fewshot dataset {short_name!r}: expected (tfds_name, train_split, "
                         f"test_split), got {spec!r}.")
      tfds_name, train_split, test_split = spec
      # Fails now, with the command that prepares the dataset, not after hours of training.
      builder = datasets_lib.get_builder(tfds_name, data_dir)
      num_classes = builder.info.features["label"].num_classes
      self.datasets[short_name] = (
          {"name": tfds_name, "split": train_split, "data_dir": data_dir},
          {"name": tfds_name, "split": test_split, "data_dir": data_dir}, num_classes)
      for split in (train_split, test_split):
        datasets_lib.num_examples({"name": tfds_name, "split": split, "data_dir": data_dir})

    predict_fn = common.make_predict_fn(model, config.get("pred", "pre_logits"))

    def embed(params, batch):
      return predict_fn(params, batch["image"])
    self._embed = jax.jit(embed)

  def run(self, params: Any) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for short_name, (train, test, num_classes) in self.datasets.items():
      x_train, y_train = embed_split(self._embed, params, train, self.pp_train,
                                     self.batch_size, mesh=self.mesh, data_axis=self.data_axis)
      x_test, y_test = embed_split(self._embed, params, test, self.pp_eval, self.batch_size,
                                   mesh=self.mesh, data_axis=self.data_axis)
      metrics.update(fewshot.fewshot_results(
          x_train, y_train, x_test, y_test, name=short_name, num_classes=num_classes,
          shots=self.shots, seeds=self.seeds, l2_reg=self.l2_reg,
          loo_l2_grid=self.loo_l2_grid))
    metrics.update(fewshot.fewshot_average(metrics, list(self.datasets), shots=self.shots))
    return metrics
