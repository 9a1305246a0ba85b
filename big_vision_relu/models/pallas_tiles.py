"""What one tile pair computes in the fused Pallas kernels, shared by the TPU (pallas_tpu.py) and
GPU (pallas_gpu.py) kernels: the scores and `h` of the family (models/attention.py) on one head's
`[rows, head_dim]` tiles, with no row statistic.

The constants of the family are applied where they cost nothing: the pointwise weight is
`c * h(s)` with `c = key_len ** -seqlen_alpha` (`attention.seqlen_scale`), a constant, so the
kernels sum `h(s) v` and multiply the finished sums by `c` once (output, dk, dv; dq in the XLA
epilogue that casts it); `1 / sqrt(head_dim)` multiplies the tile a kernel keeps for all of its
loop (queries in the forward pass, keys in the backward pass), once per tile.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from big_vision_relu.models import attention

Array = jax.Array

NN = (((1,), (0,)), ((), ()))  # dot_general: a [m, k] x b [k, n] -> [m, n]
NT = (((1,), (1,)), ((), ()))  # a [m, k] x b [n, k] -> [m, n] (b transposed)


@dataclasses.dataclass(frozen=True)
class TileSpec:
  """The static description of one fused attention call (hashable, for `custom_vjp`)."""
  options: attention.AttentionOptions  # the attention's one validated options object
  q_len: int  # the true (unpadded) lengths: rows past them are masked inside the kernels
  key_len: int  # also the scale's L
  out_dtype: np.dtype
  # Run by a Pallas interpreter on XLA:CPU, which (jax 0.10.2 with YNNPACK) fails on some bf16
  # x bf16 -> float32 products: they take float32 operands there, the same values (a product
  # of two bf16 numbers is exact in float32, and the sum is float32 either way).
  interpreted: bool = False

  @property
  def scale(self) -> float:
    """`key_len ** -seqlen_alpha`: multiplies the finished sums, not each weight."""
    return attention.seqlen_scale(self.key_len, self.options.seqlen_alpha)

  def score_dtype(self, query: Array, key: Array) -> Any:
    """float32 (or wider) with `float32_scores`, else the inputs' dtype."""
    dtype = jnp.result_type(query, key)
    return jnp.promote_types(dtype, jnp.float32) if self.options.float32_scores else dtype

  def dot(self, a: Array, b: Array, dims: Any = NN, out_dtype: Any = jnp.float32) -> Array:
    """a x b (`dims`: dot_general's dimension numbers, default a [m, k] x b [k, n]) in the
    operands' dtype, accumulated in float32 (at least) and returned in `out_dtype`."""
    if self.interpreted:
      a, b = (x.astype(jnp.promote_types(x.dtype, jnp.float32)) for x in (a, b))
      return lax.dot_general(a, b, dims, precision=self.options.precision,
                             preferred_element_type=jnp.promote_types(out_dtype, jnp.float32)
                             ).astype(out_dtype)
    return lax.dot_general(a, b, dims, precision=self.options.precision,
                           preferred_element_type=out_dtype)

  def output_part(self, scaled_q: Array, key: Array, value: Array) -> Array:
    """`h(q k^T / sqrt(d)) v` of one tile pair, float32 `[bq, dv]` (q already divided by
    sqrt(head_dim), as `attention.scaled_query` does; no `c`)."""
    scores = self.dot(scaled_q, key, NT, self.score_dtype(scaled_q, key))
    weights = attention.ACTIVATIONS[self.options.activation](scores)
    return self.dot(weights.astype(value.dtype), value)

  def transposed_grads(self, scaled_k: Array, value: Array, query: Array,
                       d_out: Array) -> tuple[Array, Array]:
    """(P^T, dS^T), both `[bk, bq]` in the values' dtype, of one tile pair, computed key-major:
    S^T = (k / sqrt(d)) q^T and dP^T = v d_out^T are direct products of the loaded tiles, so
    neither P nor dS is ever transposed in registers. P = h(S), dS = h'(S) * dP (h' by jax's
    VJP of h; no `c`), so that dv = c P^T d_out, dk = c dS^T q / sqrt(d), dq = c dS k / sqrt(d).
    """
    scores_t = self.dot(scaled_k, query, NT, self.score_dtype(scaled_k, query))
    weights_t, h_vjp = jax.vjp(attention.ACTIVATIONS[self.options.activation], scores_t)
    d_weights_t = self.dot(value, d_out.astype(value.dtype), NT)
    (d_scores_t,) = h_vjp(d_weights_t.astype(weights_t.dtype))
    return weights_t.astype(value.dtype), d_scores_t.astype(value.dtype)


def valid_rows(start: Array | int, rows: int, length: int, width: int | None = None) -> Array:
  """`[rows, 1]` (or `[rows, width]`) booleans: row `start + r` lies before `length`."""
  shape = (rows, 1 if width is None else width)
  return lax.broadcasted_iota(jnp.int32, shape, 0) + start < length


def pow2_at_least(n: int) -> int:
  """The smallest power of two >= n."""
  return 1 << max(0, (n - 1).bit_length())
