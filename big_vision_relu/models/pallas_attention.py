"""`attention_impl='pallas'`: pointwise attention as fused Pallas kernels, forward and backward.

The kernels run per lowering platform (`lax.platform_dependent`, not the default backend, so a
program lowered for a TPU or a GPU on a CPU host gets that platform's kernels):
  TPU   Mosaic kernels (pallas_tpu.py): tiles of multiples of 128, a one-kernel backward.
  GPU   Triton kernels (pallas_gpu.py): power-of-two tiles, a one-kernel backward with dq added
        atomically.
  CPU   the GPU kernels in the Pallas interpreter (tests also run the TPU kernels in Pallas's
        TPU interpreter, tests/test_pallas_attention.py).
Both compute each tile pair with pallas_tiles.py (the family's h and scores, no row statistic)
and keep only q, k and v for the backward pass (`blockwise.recomputing_vjp`), so memory is O(len).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax import lax

from big_vision_relu.models import attention, blockwise, pallas_gpu, pallas_tpu
from big_vision_relu.models.pallas_tiles import TileSpec

Array = jax.Array


def _forward(spec: TileSpec, query: Array, key: Array, value: Array) -> Array:
  return lax.platform_dependent(
      query, key, value, cpu=functools.partial(pallas_gpu.forward, spec, interpret=True),
      tpu=functools.partial(pallas_tpu.forward, spec),
      default=functools.partial(pallas_gpu.forward, spec))


def _backward(spec: TileSpec, query: Array, key: Array, value: Array,
              d_out: Array) -> tuple[Array, Array, Array]:
  return lax.platform_dependent(
      query, key, value, d_out, cpu=functools.partial(pallas_gpu.backward, spec, interpret=True),
      tpu=functools.partial(pallas_tpu.backward, spec),
      default=functools.partial(pallas_gpu.backward, spec))


_fused_attention = blockwise.recomputing_vjp(_forward, _backward)


def pallas_pointwise_attention(options: attention.AttentionOptions, query: Array, key: Array,
                               value: Array, *, mask: Array | None = None,
                               dtype: Any = None) -> Array:
  """`blockwise.chunked_pointwise_attention` as fused Pallas kernels, forward and backward: the
  same function as `attention.dense_attention` with memory O(len).

  Args:
    options: `AttentionOptions(impl='pallas', ...)`, a pointwise activation; `block_size` caps
      the tiles (GPU: powers of two, 128 by default; TPU: multiples of 128, 512 by default).
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., k_len, heads, head_dim]`.
    value: `[batch..., k_len, heads, head_dim]`.
    mask: must be None.
    dtype: output dtype (default: the values' dtype), written by the kernel.
  Returns:
    `[batch..., q_len, heads, head_dim]`. XLA does not split a compiled kernel over devices:
    with a batch sharded over several devices, call it inside `shard_map`.
  """
  options.require_impl("pallas")
  blockwise.reject_mask("pallas", mask)
  if value.shape[-1] != query.shape[-1]:
    raise ValueError(f"attention_impl='pallas' needs values as wide as the queries, got head "
                     f"dims {query.shape[-1]} and {value.shape[-1]}.")
  spec = TileSpec(options, query.shape[-3], key.shape[-3], np.dtype(dtype or value.dtype))
  flat = [x.reshape(-1, *x.shape[-3:]) for x in (query, key, value)]
  return _fused_attention(spec, *flat).reshape(query.shape[:-1] + value.shape[-1:])
