"""The flax multi-head attention layer of the ViT, running any of the attention implementations.

It sits above models/attention.py (the family, its options and the dense path), blockwise.py
(chunked, seq_parallel), pallas_attention.py and cudnn_attention.py, which build on
attention.py, so it lives in a module of its own.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from big_vision_relu.models import attention, blockwise, cudnn_attention, pallas_attention
from big_vision_relu.models.attention import AttentionOptions

Array = jax.Array


def on_flat_tokens(layer: Callable[[Array], Array], x: Array, feature_axes: int = 1) -> Array:
  """`layer(x)` with the leading (batch, token) axes of x merged into one and restored after.

  x `[batch..., *features]` (`feature_axes` trailing axes) -> `[batch..., *layer's features]`.
  The same maths; but a Dense over `[batch * tokens, features]` contracts one axis in its weight
  gradient, which XLA:CPU computes 2-3x faster than over the two axes of `[batch, tokens,
  features]` (for which it first transposes the gradient; docs/benchmarks.md, section 3).
  """
  lead = x.shape[:x.ndim - feature_axes]
  y = layer(x.reshape(-1, *x.shape[len(lead):]))
  return y.reshape(*lead, *y.shape[1:])


def attend(options: AttentionOptions, query: Array, key: Array, value: Array, *,
           mask: Array | None = None, dtype: Any = None,
           module: nn.Module | None = None) -> Array:
  """q `[batch..., q_len, heads, d]`, k/v `[batch..., k_len, heads, d]` -> `[batch..., q_len,
  heads, d]`: the implementation `options.impl` names, given `options` itself.

  `module` (dense only): sow the weights into its `intermediates/attention_weights`.
  """
  if options.impl == "dense":
    return attention.dense_attention(options, query, key, value, mask=mask, dtype=dtype,
                                     module=module)
  implementation = {"chunked": blockwise.chunked_pointwise_attention,
                    "seq_parallel": blockwise.seq_parallel_pointwise_attention,
                    "pallas": pallas_attention.pallas_pointwise_attention,
                    "cudnn": cudnn_attention.cudnn_softmax_attention}[options.impl]
  return implementation(options, query, key, value, mask=mask, dtype=dtype)


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head self/cross attention with the activation family, qk-LN and an optional gate.

  Parameter names equal flax's `nn.MultiHeadDotProductAttention` (query, key, value, out, and
  query_ln/key_ln with `options.qk_norm`), so big_vision checkpoints load; with `options.gated`
  one more projection `gate` of the query input, shaped like the per-head output `[...,
  heads, head_dim]`, multiplies the attention output elementwise before `out` (the paper's
  gating ablation; bias on, activation `options.gate_activation`, 'none' by default as the
  paper names none). `options.impl` picks the implementation; the parameters are the same for
  all four. The default options are flax's softmax attention. `flatten_tokens`: the
  projections run on `[batch * len, ...]` (`on_flat_tokens`; same parameters and maths).
  """
  num_heads: int
  options: AttentionOptions = AttentionOptions()
  dtype: Any = None
  kernel_init: Callable[..., Array] = nn.initializers.xavier_uniform()
  flatten_tokens: bool = False

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array | None = None, *,
               mask: Array | None = None, sow_weights: bool = False) -> Array:
    """inputs_q `[batch, q_len, width]`, inputs_kv `[batch, k_len, width]` (default: inputs_q)
    -> `[batch, q_len, width]`."""
    options = self.options
    if sow_weights and options.impl != "dense":
      raise ValueError(f"sow_weights=True needs impl='dense': impl={options.impl!r} never "
                       "materialises the attention weights.")
    if options.gated and inputs_kv is not None:
      raise ValueError("gated=True needs self-attention: the gate projects the block's own "
                       "input, which a cross-attention (e.g. the MAP head's probe) does not "
                       "have. Set gated=False for this module.")
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    width = inputs_q.shape[-1]
    if width % self.num_heads:
      raise ValueError(f"width {width} is not divisible by num_heads {self.num_heads}.")
    head_dim = width // self.num_heads

    def project(layer: nn.Module, x: Array, feature_axes: int = 1) -> Array:
      return on_flat_tokens(layer, x, feature_axes) if self.flatten_tokens else layer(x)

    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, head_dim),
                              kernel_init=self.kernel_init, dtype=self.dtype)
    query = project(dense(name="query"), inputs_q)
    key = project(dense(name="key"), inputs_kv)
    value = project(dense(name="value"), inputs_kv)
    if options.qk_norm:
      # Per-head LayerNorm over head_dim, scale only: flax's normalize_qk=True.
      query = nn.LayerNorm(use_bias=False, dtype=self.dtype, name="query_ln")(query)
      key = nn.LayerNorm(use_bias=False, dtype=self.dtype, name="key_ln")(key)
    x = attend(options, query, key, value, mask=mask, dtype=self.dtype,
               module=self if sow_weights else None)
    if options.gated:
      gate = project(dense(name="gate"), inputs_q)
      x = x * attention.GATE_ACTIVATIONS[options.gate_activation](gate)
    return project(nn.DenseGeneral(features=width, axis=(-2, -1), kernel_init=self.kernel_init,
                                   dtype=self.dtype, name="out"), x, feature_axes=2)
