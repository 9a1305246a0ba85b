"""Classification evaluator: prec@1 and loss over an eval split (optionally label-mapped).

Sums run inside one jitted function over global (sharded) batches, so the totals are over all
hosts without any explicit collective; padding examples (`_mask` False) count for nothing.
Labels are `[batch, classes]` one-hot or multi-hot: top-1 is correct when the argmax class is
one of the example's positive labels.

Label-mapped (`label_map='i21k_to_i1k'`): the ImageNet-1k accuracy of a 21,843-class head with
no fine-tuning: logits are restricted to the 1,000 ImageNet-1k classes (by wordnet id) before
the argmax and the loss. ImageNet-1k class 850 (teddy bear, n04399382) has no ImageNet-21k
class: its column is -inf, so those images always count as errors (accuracy capped at 99.9%);
we keep them rather than drop them so the denominator is the full validation set.
A head trained on another ImageNet-21k release names its dataset instead
(`label_map='imagenet21k/winter2021'`): the map is computed by wnid from that prepared dataset's
label names (looked up in the eval data's `data_dir`), with -inf for every ImageNet-1k class
the release lacks.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from big_vision_relu import config as cfg_lib
from big_vision_relu import losses
from big_vision_relu.data import batching
from big_vision_relu.data import inputs
from big_vision_relu.data import label_maps
from big_vision_relu.evaluators import common

LABEL_MAPS: dict[str, Callable[[], np.ndarray]] = {
    "i21k_to_i1k": label_maps.i21k_to_i1k_indices,
}
_I21K = "imagenet21k"
_LABEL_MAP_NAMES = (f"{' or '.join(LABEL_MAPS)} or {_I21K}/<release> (the dataset whose label "
                    "names are the head's classes)")


def _is_i21k_release(label_map: str) -> bool:
  """Names an ImageNet-21k release's dataset: `imagenet21k/<release>[:version]`."""
  return label_map.split("/")[0].split(":")[0] == _I21K


def label_map_indices(label_map: str, data_dir: str | None = None) -> np.ndarray:
  """The ImageNet-1k -> head class indices of `label_map`: a name in `LABEL_MAPS`, or an
  ImageNet-21k release's dataset (`imagenet21k/<release>`, prepared in `data_dir`)."""
  if label_map in LABEL_MAPS:
    return LABEL_MAPS[label_map]()
  if _is_i21k_release(label_map):
    from big_vision_relu.data import datasets  # TFDS: only this label map needs it
    names = datasets.get_builder(label_map, data_dir).info.features["label"].names
    return label_maps.i1k_indices(names)
  raise ValueError(f"Unknown label_map {label_map!r}; valid: {_LABEL_MAP_NAMES}.")


def restrict_logits(logits: jax.Array, indices: np.ndarray) -> jax.Array:
  """`logits[:, indices]`, with -inf where an index is -1 (a class the head does not have)."""
  indices = np.asarray(indices)
  picked = jnp.take(logits, np.maximum(indices, 0), axis=-1)
  return jnp.where(indices >= 0, picked, -jnp.inf)


def batch_sums(logits: jax.Array, labels: jax.Array, mask: jax.Array, *, loss_name: str,
               label_map: np.ndarray | None = None) -> dict[str, jax.Array]:
  """Sums over the real examples of a batch: correct top-1, loss, and count."""
  if label_map is not None:
    logits = restrict_logits(logits, label_map)
  mask = mask.astype(jnp.float32)
  top1 = jnp.argmax(logits, axis=-1)
  correct = jnp.take_along_axis(labels, top1[:, None], axis=-1)[:, 0] > 0
  loss = losses.per_example_loss(jnp.where(jnp.isfinite(logits), logits, -1e9), labels, loss_name)
  return {"correct": jnp.sum(correct * mask), "loss": jnp.sum(loss * mask),
          "count": jnp.sum(mask)}


class ClassificationEvaluator:
  """prec@1 and loss of the model's output `pred` on one eval split.

  `config` (under `evals.<name>`, type='classification') is filled and checked against
  `CONFIG_SCHEMA` (`registry.evaluator_config`).
  """
  CONFIG_SCHEMA: cfg_lib.Schema = {
      "data": cfg_lib.DATA_SCHEMA,
      "pp_fn": common.pp_key("`image` and one-hot `labels`, e.g. 'decode|onehot(10)'"),
      "batch_size": common.BATCH_SIZE_KEY,
      # None: the run's training loss (`default_loss`).
      "loss_name": cfg_lib.Key(None, cfg_lib.check_that(
          f"one of {', '.join(losses.LOSSES)} (unset: the run's loss)",
          lambda v: v in losses.LOSSES)),
      # None: the head's classes are the labels' classes.
      "label_map": cfg_lib.Key(None, cfg_lib.check_that(
          _LABEL_MAP_NAMES,
          lambda v: isinstance(v, str) and (v in LABEL_MAPS or _is_i21k_release(v)))),
      "pred": common.pred_key("logits"),
  }

  def __init__(self, config: Mapping[str, Any], *, model: nn.Module, mesh: jax.sharding.Mesh,
               data_axis: str | tuple[str, ...] = "data", pipeline: str, default_loss: str):
    self.data = dict(config["data"])
    loss_name = default_loss if config["loss_name"] is None else config["loss_name"]
    label_map = config["label_map"]
    indices = label_map_indices(label_map, self.data["data_dir"]) if label_map else None
    # Fails now, not after hours of training, when the data is missing or badly specified.
    self._batches = inputs.EvalData(self.data, config["pp_fn"], config["batch_size"],
                                    pipeline=pipeline, mesh=mesh, data_axis=data_axis)
    self.num_examples = self._batches.num_examples
    predict_fn = common.make_predict_fn(model, config["pred"])

    def sums(params, batch):
      logits = predict_fn(params, batch["image"])
      return batch_sums(logits, batch["labels"], batch[batching.MASK_KEY],
                        loss_name=loss_name, label_map=indices)
    self._sums = jax.jit(sums)

  def run(self, params: Any) -> dict[str, float]:
    """Returns {'prec@1': ..., 'loss': ..., 'num_examples': ...} over the whole split."""
    totals = None
    for batch in self._batches:
      sums = self._sums(params, batch)
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.device_get(totals)
    count = float(totals["count"])
    if count != self.num_examples:
      raise RuntimeError(f"Evaluated {count} examples of {self.data}, expected "
                         f"{self.num_examples}: the eval padding is wrong.")
    return {"prec@1": float(totals["correct"]) / count, "loss": float(totals["loss"]) / count,
            "num_examples": count}
