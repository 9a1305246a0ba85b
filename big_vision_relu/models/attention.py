"""The attention family of "Replacing softmax with ReLU in Vision Transformers".

All the attention maths of the project lives here. For scores `s = q.k / sqrt(head_dim)`:

    softmax:    w = softmax(s) over keys (the baseline; ignores `seqlen_alpha`)
    pointwise:  w = key_len ** -seqlen_alpha * h(s),   h in ACTIVATIONS

The `key_len ** -seqlen_alpha` factor multiplies h's OUTPUT (for relu2, gelu, softplus, relu6 and
sigmoid that differs from scaling the scores). `key_len` is the number of keys each query attends
over: the size of the key-length axis, class token included. A mask does NOT change it: masked
keys get weight 0 but still count, because a per-row count of unmasked keys would be a row
normalisation, which is exactly what the pointwise family does without.

`pointwise_weights` is the single definition of the family; the dense path below (and the
chunked and sequence-parallel paths) call it with the global `key_len`, so every path computes
the same function.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

# h of the pointwise family. gelu is the exact erf form, as in the paper's family.
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": jax.nn.relu,
    "relu2": lambda x: jnp.square(jax.nn.relu(x)),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "softplus": jax.nn.softplus,
    "identity": lambda x: x,
    "relu6": jax.nn.relu6,
    "sigmoid": jax.nn.sigmoid,
}
ATTENTION_NAMES: tuple[str, ...] = ("softmax", *ACTIVATIONS)

GATE_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "none": lambda x: x,
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
}


def validate_attention(activation: str, seqlen_alpha: float) -> None:
  """Raises ValueError for an unknown activation or a bad `seqlen_alpha`."""
  if activation not in ATTENTION_NAMES:
    raise ValueError(
        f"Unknown attention activation {activation!r}; valid choices: "
        f"{', '.join(ATTENTION_NAMES)}.")
  if not (isinstance(seqlen_alpha, (int, float)) and math.isfinite(seqlen_alpha)
          and seqlen_alpha >= 0):
    raise ValueError(
        f"seqlen_alpha must be a finite number >= 0 (the exponent of key_len ** -alpha), "
        f"got {seqlen_alpha!r}.")


def pointwise_weights(scores: Array, *, activation: str, seqlen_alpha: float,
                      key_len: int) -> Array:
  """`key_len ** -seqlen_alpha * h(scores)`: the one definition of the pointwise family.

  Args:
    scores: already scaled by 1/sqrt(head_dim), any shape; for blockwise paths a block of the
      full score matrix.
    activation: a key of ACTIVATIONS (not softmax: it is not pointwise).
    seqlen_alpha: exponent of the sequence-length scale.
    key_len: the GLOBAL number of keys each query attends over (not a block's size).
  Returns:
    Weights with the shape and dtype of `scores`.
  """
  scale = float(key_len) ** -float(seqlen_alpha)
  return ACTIVATIONS[activation](scores) * jnp.asarray(scale, scores.dtype)


def _scores(query: Array, key: Array, *, float32: bool, precision: Any) -> Array:
  """[batch..., q, heads, d] x [batch..., k, heads, d] -> [batch..., heads, q, k] / sqrt(d)."""
  compute_dtype = jnp.result_type(query, key)
  if float32:  # at least float32: bfloat16 is upcast, float64 stays float64.
    compute_dtype = jnp.promote_types(compute_dtype, jnp.float32)
  query = query / jnp.sqrt(query.shape[-1]).astype(query.dtype)
  return jnp.einsum("...qhd,...khd->...hqk", query, key, precision=precision,
                    preferred_element_type=compute_dtype)


def _weights(scores: Array, mask: Array | None, *, activation: str, seqlen_alpha: float,
             key_len: int) -> Array:
  """Scores [..., heads, q, k] -> weights, masked entries exactly 0."""
  if activation == "softmax":
    if mask is not None:
      scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    return jax.nn.softmax(scores, axis=-1)
  weights = pointwise_weights(scores, activation=activation, seqlen_alpha=seqlen_alpha,
                              key_len=key_len)
  # Zero AFTER the activation: adding -inf first would give NaN for gelu/identity/softplus.
  return weights if mask is None else jnp.where(mask, weights, 0.0)


def attention_weights(query: Array, key: Array, *, activation: str, seqlen_alpha: float = 1.0,
                      mask: Array | None = None, float32_scores: bool = True,
                      precision: Any = None) -> Array:
  """Attention weights `[batch..., heads, q_len, k_len]` for inspection (same maths as below).

  Args:
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., k_len, heads, head_dim]`.
    activation: one of ATTENTION_NAMES.
    seqlen_alpha: exponent of `key_len ** -seqlen_alpha` (ignored by softmax).
    mask: boolean, broadcastable to `[batch..., heads, q_len, k_len]`; False = not attended.
    float32_scores: compute scores and weights in float32 even for bfloat16 inputs.
    precision: matmul precision for the q.k product.
  """
  validate_attention(activation, seqlen_alpha)
  scores = _scores(query, key, float32=float32_scores, precision=precision)
  return _weights(scores, mask, activation=activation, seqlen_alpha=seqlen_alpha,
                  key_len=key.shape[-3])


def pointwise_attention(query: Array, key: Array, value: Array, *, activation: str = "relu",
                        seqlen_alpha: float = 1.0, mask: Array | None = None,
                        dropout_rng: Array | None = None, dropout_rate: float = 0.0,
                        broadcast_dropout: bool = True, deterministic: bool = True,
                        dtype: Any = None, precision: Any = None, float32_scores: bool = True,
                        module: nn.Module | None = None) -> Array:
  """Attention with softmax or pointwise weights; a drop-in flax `attention_fn`.

  Args:
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., k_len, heads, head_dim]`.
    value: `[batch..., k_len, heads, v_dim]`.
    activation: one of ATTENTION_NAMES.
    seqlen_alpha: weights are `k_len ** -seqlen_alpha * h(q.k / sqrt(head_dim))`.
    mask: boolean, broadcastable to `[batch..., heads, q_len, k_len]`; False = not attended.
    dropout_rng, dropout_rate, broadcast_dropout, deterministic: attention-weight dropout, as
      in flax (`broadcast_dropout` shares the mask over the batch and head dimensions).
    dtype: output dtype (default: the inputs' dtype).
    precision: matmul precision.
    float32_scores: compute scores and weights in float32 even when inputs are bfloat16.
    module: when flax passes its module (`sow_weights=True`), the weights are sown into
      `intermediates/attention_weights`.
  Returns:
    `[batch..., q_len, heads, v_dim]`.
  """
  weights = attention_weights(query, key, activation=activation, seqlen_alpha=seqlen_alpha,
                              mask=mask, float32_scores=float32_scores, precision=precision)
  if module is not None:
    module.sow("intermediates", "attention_weights", weights)
  if not deterministic and dropout_rate > 0.0:
    keep_prob = 1.0 - dropout_rate
    shape = ((1,) * (weights.ndim - 2) + weights.shape[-2:] if broadcast_dropout
             else weights.shape)
    keep = jax.random.bernoulli(dropout_rng, keep_prob, shape)
    weights = weights * (keep / keep_prob).astype(weights.dtype)
  out_dtype = dtype or value.dtype
  # The product with v runs in value's dtype (bf16 on TPU) and accumulates in float32 when the
  # weights were kept in float32.
  return jnp.einsum("...hqk,...khd->...qhd", weights.astype(value.dtype), value,
                    precision=precision,
                    preferred_element_type=jnp.promote_types(weights.dtype, value.dtype)
                    ).astype(out_dtype)


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head self/cross attention with the activation family, qk-LN and an optional gate.

  Parameter names equal flax's `nn.MultiHeadDotProductAttention` (query, key, value, out, and
  query_ln/key_ln with qk-LN), so big_vision checkpoints load; with `gated=True` one more
  projection `gate` of the query input, shaped like the per-head output `[..., heads,
  head_dim]`, multiplies the attention output elementwise before `out` (the paper's gating
  ablation; bias on, activation `gate_activation`, 'none' by default as the paper names none).
  """
  num_heads: int
  activation: str = "softmax"
  seqlen_alpha: float = 1.0
  qk_norm: bool = False
  gated: bool = False
  gate_activation: str = "none"
  dtype: Any = None
  kernel_init: Callable[..., Array] = nn.initializers.xavier_uniform()
  float32_scores: bool = True

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array | None = None, *,
               mask: Array | None = None, sow_weights: bool = False) -> Array:
    """inputs_q `[batch, q_len, width]`, inputs_kv `[batch, k_len, width]` (default: inputs_q)
    -> `[batch, q_len, width]`."""
    validate_attention(self.activation, self.seqlen_alpha)
    if self.gate_activation not in GATE_ACTIVATIONS:
      raise ValueError(f"Unknown gate_activation {self.gate_activation!r}; valid choices: "
                       f"{', '.join(GATE_ACTIVATIONS)}.")
    if self.gated and inputs_kv is not None:
      raise ValueError("gated=True needs self-attention: the gate projects the block's own "
                       "input, which a cross-attention (e.g. the MAP head's probe) does not "
                       "have. Set gated=False for this module.")
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    width = inputs_q.shape[-1]
    if width % self.num_heads:
      raise ValueError(f"width {width} is not divisible by num_heads {self.num_heads}.")
    head_dim = width // self.num_heads
    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, head_dim),
                              kernel_init=self.kernel_init, dtype=self.dtype)
    query = dense(name="query")(inputs_q)
    key = dense(name="key")(inputs_kv)
    value = dense(name="value")(inputs_kv)
    if self.qk_norm:
      # Per-head LayerNorm over head_dim, scale only: flax's normalize_qk=True.
      query = nn.LayerNorm(use_bias=False, dtype=self.dtype, name="query_ln")(query)
      key = nn.LayerNorm(use_bias=False, dtype=self.dtype, name="key_ln")(key)
    x = pointwise_attention(query, key, value, activation=self.activation,
                            seqlen_alpha=self.seqlen_alpha, mask=mask, dtype=self.dtype,
                            float32_scores=self.float32_scores,
                            module=self if sow_weights else None)
    if self.gated:
      gate = dense(name="gate")(inputs_q)
      x = x * GATE_ACTIVATIONS[self.gate_activation](gate)
    return nn.DenseGeneral(features=width, axis=(-2, -1), kernel_init=self.kernel_init,
                           dtype=self.dtype, name="out")(x)
