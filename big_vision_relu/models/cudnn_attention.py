"""`attention_impl='cudnn'`: softmax attention as cuDNN's flash attention, on a GPU.

The baseline a pointwise kernel has to beat: `jax.nn.dot_product_attention(implementation=
'cudnn')`. cuDNN (through jax 0.11) refuses the lengths of a ViT with a class token (197, 785:
odd), so both lengths are zero-padded to a multiple of `LENGTH_MULTIPLE` and the padding is
masked by cuDNN itself, from the true lengths (`query_seq_lengths`, `key_value_seq_lengths`):
padded keys get no weight, padded queries are sliced off.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from big_vision_relu.models import attention

Array = jax.Array
LENGTH_MULTIPLE = 2  # cuDNN's flash attention takes even lengths


def padded_softmax(query: Array, key: Array, value: Array, *, implementation: str = "cudnn",
                   multiple: int = LENGTH_MULTIPLE) -> Array:
  """`jax.nn.dot_product_attention(q, k, v, implementation=...)` on lengths zero-padded to a
  multiple of `multiple`, the padding masked by the true lengths; q `[B, q_len, heads, d]`, k/v
  `[B, k_len, heads, d]` -> `[B, q_len, heads, d]`. `implementation='xla'` runs the same
  padding anywhere (what the CPU tests check)."""
  q_len, k_len = query.shape[1], key.shape[1]
  pad = lambda x, length: jnp.pad(  # noqa: E731
      x, ((0, 0), (0, -length % multiple), (0, 0), (0, 0)))
  if q_len % multiple == 0 and k_len % multiple == 0:
    return jax.nn.dot_product_attention(query, key, value, implementation=implementation)
  lengths = lambda n: jnp.full((query.shape[0],), n, jnp.int32)  # noqa: E731
  out = jax.nn.dot_product_attention(
      pad(query, q_len), pad(key, k_len), pad(value, k_len), query_seq_lengths=lengths(q_len),
      key_value_seq_lengths=lengths(k_len), implementation=implementation)
  return out[:, :q_len]


def cudnn_softmax_attention(options: attention.AttentionOptions, query: Array, key: Array,
                            value: Array, *, mask: Array | None = None,
                            dtype: Any = None) -> Array:
  """Softmax attention by cuDNN (`padded_softmax`); a GPU only (jax raises elsewhere).

  Args:
    options: `AttentionOptions(activation='softmax', impl='cudnn')`; cuDNN computes its scores
      and weights in float32 whatever `float32_scores`, at its own precision.
    query: `[batch..., q_len, heads, head_dim]`.
    key, value: `[batch..., k_len, heads, head_dim]`.
    mask: must be None.
    dtype: output dtype (default: the values').
  Returns:
    `[batch..., q_len, heads, head_dim]`.
  """
  options.require_impl("cudnn")
  if mask is not None:
    raise ValueError("attention_impl='cudnn' takes no mask (a ViT needs none); use "
                     "attention_impl='dense' for masked attention.")
  flat = [x.reshape(-1, *x.shape[-3:]) for x in (query, key, value)]
  out = padded_softmax(*flat)
  return out.reshape(query.shape[:-1] + value.shape[-1:]).astype(dtype or value.dtype)
