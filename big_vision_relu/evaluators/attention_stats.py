"""Attention statistics during training: a light version of the notebook's (`inspect`).

Config (under `evals.<name>`, type='attention_stats'; `AttentionStatsEvaluator.CONFIG_SCHEMA`
has each key's default and check):
  data          {name, split, data_dir} of an eval split
  pp_fn         its (deterministic) pp, producing `image`
  batch_size    global batch size
  num_examples  how many of the split's first examples to look at (default 128, rounded up to
                whole batches; the split's size at most)
plus the log cadence keys read by the trainer. Metrics, for each encoder layer i (definitions
in `evaluators.attention_statistics`):
  layer{i}/zeros         fraction of exactly-zero attention weights (ReLU sparsity)
  layer{i}/row_sum_mean  mean over rows of sum_k w (softmax: 1)
  layer{i}/entropy       mean entropy (nats) of the row-normalised |w|, over non-zero rows
  layer{i}/distance      mean attention distance in patches, over patch queries
  layer{i}/attention_to_residual  mean over tokens of |attention branch| / |residual stream
                         entering the block| (L2 over width; `attention_shares`): near 0, the
                         layer's attention hardly changes the tokens
  num_examples           the examples they are computed on

The model the registry gives is run with its attention weights sown (`sow_attention_weights`);
the sums over the real examples (padding masked) are computed inside one jitted function over
global batches.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from big_vision_relu import config as cfg_lib
from big_vision_relu.data import batching
from big_vision_relu.data import inputs
from big_vision_relu.evaluators import attention_capture
from big_vision_relu.evaluators import attention_statistics
from big_vision_relu.evaluators import common
from big_vision_relu.models import vit


def layer_sums(weights: jax.Array, mask: jax.Array, layout: attention_statistics.TokenLayout
               ) -> dict[str, jax.Array]:
  """One layer's weights `[n, heads, q, k]` -> sums (and their counts) over real examples."""
  rows = attention_statistics.row_statistics(weights, layout.grid_shape, layout.num_prefix_tokens)
  mask = mask.astype(weights.dtype)
  total = lambda x: jnp.sum(x.sum((1, 2)) * mask)  # noqa: E731  (over heads, rows; examples)
  num_rows = jnp.sum(mask) * weights.shape[1] * weights.shape[2]
  return {
      "zeros": total(rows["zeros"]), "entries": num_rows * weights.shape[3],
      "row_sum": total(rows["row_sum"]), "rows": num_rows,
      "entropy": total(rows["entropy"] * rows["live"]), "live": total(rows["live"]),
      "distance": total(rows["distance"] * rows["distance_valid"]),
      "distance_valid": total(rows["distance_valid"]),
  }


def branch_sums(branch: jax.Array, stream: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
  """A layer's attention branch and the residual stream it is added to (both `[n, tokens,
  width]`) -> the sum of |branch| / |stream| over the tokens of real examples whose stream is
  not 0 (as `attention_shares`), and their count."""
  branch_norm = jnp.linalg.norm(branch.astype(jnp.float32), axis=-1)
  stream_norm = jnp.linalg.norm(stream.astype(jnp.float32), axis=-1)
  live = (stream_norm > 0) & mask[:, None]
  ratio = jnp.where(live, branch_norm / jnp.where(live, stream_norm, 1.0), 0.0)
  return {"branch_ratio": jnp.sum(ratio), "tokens": jnp.sum(live.astype(jnp.float32))}


class AttentionStatsEvaluator:
  """Per-layer attention statistics of `model` on the first examples of an eval split (module
  docstring)."""
  CONFIG_SCHEMA: cfg_lib.Schema = {
      "data": cfg_lib.DATA_SCHEMA,
      "pp_fn": common.pp_key("`image`"),
      "batch_size": common.BATCH_SIZE_KEY,
      "num_examples": cfg_lib.Key(128, cfg_lib.check_that(
          "a positive int (how many of the split's first examples to look at)",
          cfg_lib.is_positive_int)),
  }

  def __init__(self, config: Mapping[str, Any], *, model: vit._Model,  # noqa: SLF001
               mesh: jax.sharding.Mesh, data_axis: str | tuple[str, ...] = "data",
               pipeline: str, default_loss: str | None = None):
    del default_loss  # no loss here
    # Fails now, not after hours of training, when the data is missing.
    self._batches = inputs.EvalData(config["data"], config["pp_fn"], config["batch_size"],
                                    pipeline=pipeline, mesh=mesh, data_axis=data_axis)
    available = self._batches.num_examples
    self.num_batches = math.ceil(min(config["num_examples"], available) / config["batch_size"])

    def sums(params, batch):
      layout = attention_capture.token_layout(model, batch["image"].shape[1:3])
      captured = attention_capture.apply_inspecting(model, params, batch["image"],
                                                    with_qk=False)
      mask = batch[batching.MASK_KEY]
      layers = [dict(layer_sums(w, mask, layout), **branch_sums(branch, stream, mask))
                for w, branch, stream in zip(captured["weights"], captured["attention_outputs"],
                                             captured["block_inputs"], strict=True)]
      return {"layers": layers, "count": jnp.sum(mask.astype(jnp.float32))}
    self._sums = jax.jit(sums)

  def run(self, params: Any) -> dict[str, float]:
    """Returns {'layer{i}/zeros': ..., ..., 'num_examples': n} (see the module docstring)."""
    totals = None
    batches = iter(self._batches)
    try:
      for batch in itertools.islice(batches, self.num_batches):
        sums = self._sums(params, batch)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    finally:
      batches.close()
    totals = jax.device_get(totals)
    metrics = {"num_examples": float(totals["count"])}
    ratio = lambda a, b: float(a) / float(b) if float(b) > 0 else float("nan")  # noqa: E731
    for i, s in enumerate(totals["layers"]):
      metrics[f"layer{i}/zeros"] = ratio(s["zeros"], s["entries"])
      metrics[f"layer{i}/row_sum_mean"] = ratio(s["row_sum"], s["rows"])
      metrics[f"layer{i}/entropy"] = ratio(s["entropy"], s["live"])
      metrics[f"layer{i}/distance"] = ratio(s["distance"], s["distance_valid"])
      metrics[f"layer{i}/attention_to_residual"] = ratio(s["branch_ratio"], s["tokens"])
    return metrics
