"""Statistics of what the attention did: pure functions of attention weights, q, k and the
residual stream (arrays in, arrays or table rows out; no model, no I/O).

Shared by the `attention_stats` evaluator (which logs a light version during training, with
`row_statistics` traced by jax) and the notebook front end `big_vision_relu.inspect`; the
arrays come from `attention_capture.apply_inspecting`. Per row (one query of one head) of
weights `w` over the `K` keys:

    zeros      how many w == 0 exactly (ReLU sparsity); negatives: how many w < 0
    row_sum    sum_k w (softmax: 1; relu/L: how close L^-1 sum relu(s) comes to 1)
    entropy    -sum_k p log p (nats) of the ROW-NORMALISED MAGNITUDES p = |w| / sum|w|: the
               pointwise family's rows are not distributions (and gelu/identity can be
               negative), so the entropy describes the shape of a row, its sum is reported
               separately. Uniform over K keys: log K. Undefined (excluded) for all-zero rows.
    distance   mean attention distance (as in Dosovitskiy et al.): sum_j p_j |pos_q - pos_j|
               in PATCH units (x patch size for pixels) on the patch grid, with p the row's
               magnitudes renormalised over the PATCH keys. Prefix tokens (the class token of
               pool_type='tok') are excluded as queries and as keys.

Layer aggregates are over all rows of all images and heads (or per head): fractions of zeros
and negatives over all entries, `dead_rows` (rows that are all zero), the row-sum
distribution (mean, std, min, p05, p50, p95, max), mean entropy over non-dead rows, mean
distance over patch queries with a non-zero patch row. The tables are computed in float64
with numpy (the attention scores of `qk_logit_norms` as the model computes them, float32).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from big_vision_relu.models import attention

Array = Any  # np.ndarray or jax.Array: the row statistics run on either


@dataclasses.dataclass(frozen=True)
class TokenLayout:
  """How the encoder's tokens map to the image: `num_prefix_tokens` (class token), then the
  patches of a `grid_shape` = (rows, cols) grid in row-major order."""
  grid_shape: tuple[int, int]
  num_prefix_tokens: int


def infer_layout(k_len: int, grid_shape: tuple[int, int] | None = None,
                 num_prefix_tokens: int | None = None) -> TokenLayout:
  """The token layout of `k_len` tokens: given, or inferred for a square grid (k_len = s^2
  without a prefix token, or s^2 + 1 with a class token)."""
  if grid_shape is None:
    prefixes = [num_prefix_tokens] if num_prefix_tokens is not None else [0, 1]
    for prefix in prefixes:
      side = math.isqrt(max(k_len - prefix, 0))
      if side > 0 and side * side == k_len - prefix:
        return TokenLayout((side, side), prefix)
    raise ValueError(f"Cannot infer a square patch grid from {k_len} tokens; pass grid_shape.")
  prefix = k_len - grid_shape[0] * grid_shape[1]
  if prefix < 0 or (num_prefix_tokens is not None and prefix != num_prefix_tokens):
    raise ValueError(f"{k_len} tokens do not fit a {grid_shape} grid plus "
                     f"{num_prefix_tokens} prefix tokens.")
  return TokenLayout(tuple(grid_shape), prefix)


def patch_distances(grid_shape: tuple[int, int]) -> np.ndarray:
  """Euclidean distances `[P, P]` between the patches of a row-major grid, in patch units."""
  rows, cols = np.divmod(np.arange(grid_shape[0] * grid_shape[1]), grid_shape[1])
  return np.hypot(rows[:, None] - rows[None, :], cols[:, None] - cols[None, :])


def _namespace(x: Array) -> Any:
  return jnp if isinstance(x, jax.Array) else np


def row_statistics(weights: Array, grid_shape: tuple[int, int] | None = None,
                   num_prefix_tokens: int | None = None) -> dict[str, Array]:
  """Per-row statistics of attention weights (numpy, or jax when `weights` is a jax array).

  Args:
    weights: `[..., q_len, k_len]` self-attention weights (q_len == k_len tokens: prefix
      tokens first, then the patches of the grid in row-major order).
    grid_shape, num_prefix_tokens: the token layout (see `infer_layout`).
  Returns:
    Arrays `[..., q_len]`: 'zeros' and 'negatives' (counts over the row), 'row_sum',
    'entropy' (of the row-normalised magnitudes, nats; 0 where undefined), 'live' (1 where
    the row is not all zero: entropy defined), 'distance' (mean attention distance in
    patches; 0 where undefined), 'distance_valid' (1 for patch queries with a non-zero
    patch row). See the module docstring for the definitions.
  """
  xp = _namespace(weights)
  q_len, k_len = weights.shape[-2:]
  layout = infer_layout(k_len, grid_shape, num_prefix_tokens)
  prefix = layout.num_prefix_tokens
  if q_len != k_len:
    raise ValueError(f"Self-attention weights expected, got q_len={q_len}, k_len={k_len}.")
  dtype = weights.dtype if xp is jnp else np.float64
  weights = weights.astype(dtype)
  magnitude = xp.abs(weights)

  def normalised(m):
    mass = m.sum(-1, keepdims=True)
    return m / xp.where(mass > 0, mass, 1.0), (mass[..., 0] > 0).astype(dtype)

  p, live = normalised(magnitude)
  entropy = -(xp.where(p > 0, p * xp.log(xp.where(p > 0, p, 1.0)), 0.0)).sum(-1)

  patch_p, patch_live = normalised(magnitude[..., prefix:, prefix:])
  distance = (patch_p * patch_distances(layout.grid_shape).astype(dtype)).sum(-1)
  pad = [(0, 0)] * (weights.ndim - 2) + [(prefix, 0)]
  return {
      "zeros": (weights == 0).sum(-1).astype(dtype),
      "negatives": (weights < 0).sum(-1).astype(dtype),
      "row_sum": weights.sum(-1),
      "entropy": entropy,
      "live": live,
      "distance": xp.pad(distance, pad),
      "distance_valid": xp.pad(patch_live, pad),
  }


STAT_NAMES = ("zeros", "negatives", "dead_rows", "row_sum_mean", "row_sum_std", "row_sum_min",
              "row_sum_p05", "row_sum_p50", "row_sum_p95", "row_sum_max", "entropy", "distance")


def _aggregate(rows: dict[str, np.ndarray], k_len: int, by_head: bool) -> dict[str, np.ndarray]:
  """Per-row statistics `[n, heads, q]` -> per head `[heads]` (by_head) or per layer `[1]`."""
  def groups(x):  # [groups, rows of the group]
    return np.moveaxis(x, 1, 0).reshape(x.shape[1], -1) if by_head else x.reshape(1, -1)
  g = {name: groups(value) for name, value in rows.items()}

  def mean_where(values, valid):
    count = valid.sum(1)
    return np.where(count > 0, (values * valid).sum(1) / np.maximum(count, 1), np.nan)
  p05, p50, p95 = np.percentile(g["row_sum"], [5, 50, 95], axis=1)
  return {
      "zeros": g["zeros"].mean(1) / k_len,
      "negatives": g["negatives"].mean(1) / k_len,
      "dead_rows": 1.0 - g["live"].mean(1),
      "row_sum_mean": g["row_sum"].mean(1),
      "row_sum_std": g["row_sum"].std(1),
      "row_sum_min": g["row_sum"].min(1),
      "row_sum_p05": p05,
      "row_sum_p50": p50,
      "row_sum_p95": p95,
      "row_sum_max": g["row_sum"].max(1),
      "entropy": mean_where(g["entropy"], g["live"]),
      "distance": mean_where(g["distance"], g["distance_valid"]),
  }


def attention_statistics(weights_per_layer: Sequence[Array],
                         grid_shape: tuple[int, int] | None = None,
                         num_prefix_tokens: int | None = None, *,
                         by_head: bool = False) -> list[dict[str, float]]:
  """Statistics of each layer's attention weights (definitions: the module docstring).

  Args:
    weights_per_layer: per layer `[n, heads, q, k]` (e.g. `inspect.Inspection.weights`).
    grid_shape, num_prefix_tokens: the token layout (default: inferred, see `infer_layout`).
    by_head: one row per (layer, head) instead of per layer.
  Returns:
    Table rows: {'layer': i, ('head': h,) **{name: value for name in STAT_NAMES}}, floats
    (NaN where a statistic has no valid row, e.g. the entropy of an all-zero layer).
  """
  table = []
  for layer, layer_weights in enumerate(weights_per_layer):
    weights = np.asarray(layer_weights, np.float64)
    if weights.ndim != 4:
      raise ValueError(f"layer {layer}: expected [n, heads, q, k], got {weights.shape}.")
    rows = row_statistics(weights, grid_shape, num_prefix_tokens)
    stats = _aggregate(rows, weights.shape[-1], by_head)
    for group in range(weights.shape[1] if by_head else 1):
      table.append({"layer": layer, **({"head": group} if by_head else {}),
                    **{name: float(value[group]) for name, value in stats.items()}})
  return table


def qk_logit_norms(queries_per_layer: Sequence[Array],
                   keys_per_layer: Sequence[Array]) -> list[dict[str, float]]:
  """Sizes of what enters the attention scores, per layer (the paper's logit growth check).

  Args:
    queries_per_layer: per layer `[n, q, heads, head_dim]` (after qk-LN if the model has it;
      `inspect.Inspection.queries`).
    keys_per_layer: per layer `[n, k, heads, head_dim]`.
  Returns:
    Table rows {'layer', 'query_norm_mean', 'query_norm_max', 'key_norm_mean', 'key_norm_max'
    (L2 norms over head_dim of every token and head), 'logit_mean', 'logit_std',
    'logit_max_abs' (of the scores q.k / sqrt(head_dim) over all images, heads, q and k,
    computed by `models.attention` as the model computes them)}.
  """
  table = []
  for layer, (q, k) in enumerate(zip(queries_per_layer, keys_per_layer, strict=True)):
    queries, keys = np.asarray(q, np.float64), np.asarray(k, np.float64)
    q_norm, k_norm = np.linalg.norm(queries, axis=-1), np.linalg.norm(keys, axis=-1)
    logits = np.asarray(attention.attention_logits(jnp.asarray(q), jnp.asarray(k)), np.float64)
    table.append({"layer": layer,
                  "query_norm_mean": float(q_norm.mean()), "query_norm_max": float(q_norm.max()),
                  "key_norm_mean": float(k_norm.mean()), "key_norm_max": float(k_norm.max()),
                  "logit_mean": float(logits.mean()), "logit_std": float(logits.std()),
                  "logit_max_abs": float(np.abs(logits).max())})
  return table


def attention_shares(attention_outputs: Sequence[Array],
                     block_inputs: Sequence[Array]) -> list[dict[str, float]]:
  """How much each layer's attention changes the residual stream.

  Args:
    attention_outputs: per layer the attention branch `[n, tokens, width]`
      (`inspect.Inspection.attention_outputs`).
    block_inputs: per layer the residual stream it is added to `[n, tokens, width]`.
  Returns:
    Table rows {'layer', 'attention_to_residual': the mean over images and tokens of
    |branch| / |input| (L2 norms over width), over tokens whose input is not 0 (a class token
    initialised at 0 enters layer 0 as 0)}. Near 0: the layer's attention hardly mixes the
    tokens (e.g. a large L^-alpha the model did not make up for).
  """
  table = []
  for layer, (branch, stream) in enumerate(zip(attention_outputs, block_inputs, strict=True)):
    branch_norm = np.linalg.norm(np.asarray(branch, np.float64), axis=-1)
    stream_norm = np.linalg.norm(np.asarray(stream, np.float64), axis=-1)
    live = stream_norm > 0
    table.append({"layer": layer,
                  "attention_to_residual": float(np.mean(branch_norm[live] / stream_norm[live]))})
  return table


def received_attention(weights: Array, grid_shape: tuple[int, int] | None = None,
                       num_prefix_tokens: int | None = None) -> np.ndarray:
  """Where a layer looks, as an image: `[n, heads, q, k]` -> `[n, rows, cols]`.

  The row-normalised magnitudes (as for the entropy) of the patch queries, restricted to the
  patch keys and renormalised, averaged over queries and heads: the share of the layer's
  attention that each patch receives (sums to 1 over the grid; uniform = 1 / P).
  """
  weights = np.abs(np.asarray(weights, np.float64))
  layout = infer_layout(weights.shape[-1], grid_shape, num_prefix_tokens)
  prefix = layout.num_prefix_tokens
  patch = weights[..., prefix:, prefix:]
  mass = patch.sum(-1, keepdims=True)
  p = patch / np.where(mass > 0, mass, 1.0)
  live = (mass > 0).astype(np.float64)
  received = p.sum((1, 2)) / np.maximum(live.sum((1, 2)), 1.0)
  return received.reshape(-1, *layout.grid_shape)
