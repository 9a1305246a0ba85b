"""The Pallas path of pointwise attention: the chunked path as fused kernels (models/blockwise.py).

Forward and backward are Pallas kernels (Triton on a GPU; on CPU the Pallas interpreter, where
they are tested), each program looping over the other side's tiles inside the kernel; the tiles
compute `blockwise.BlockSpec.partial_output` (the same scores and `pointwise_weights` as every
other path), and `blockwise.recomputing_vjp` joins the forward and backward kernels.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from big_vision_relu.models import attention, blockwise

Array = jax.Array


def _pallas_block_len(length: int, max_block: int) -> tuple[int, int]:
  """(block, padded length) of the Pallas kernels: a power of two (GPU tile shapes are), at
  least 16, at most `max_block` and no larger than the length needs: 197 with max_block 128 ->
  2 blocks of 128; 33 -> 1 block of 64; 1 -> 1 block of 16."""
  block = min(max_block, max(attention.MIN_PALLAS_BLOCK, 1 << (length - 1).bit_length()))
  return block, -(-length // block) * block


def _extend_triton_lowering() -> None:
  """Gives jax's Pallas-to-Triton lowering the two primitives of exact gelu that it lacks (jax
  0.10): `erfc` (libdevice's __nv_erfcf, CUDA's erfcf) and `copy` (an identity on values).
  Private jax API, as there is no public hook; a jax that has rules of its own keeps them."""
  from jax._src.pallas.triton import lowering as triton  # noqa: PLC0415 (GPU lowering only)
  rules = triton.triton_lowering_rules
  if lax.erfc_p not in rules:
    rules[lax.erfc_p] = triton._make_dispatch_table(
        "erfc",
        cuda=[triton._Extern([jnp.float32], "__nv_erfcf", jnp.float32),
              triton._Extern([jnp.float64], "__nv_erfc", jnp.float64)],
        rocm=[triton._Extern([jnp.float32], "__ocml_erfc_f32", jnp.float32),
              triton._Extern([jnp.float64], "__ocml_erfc_f64", jnp.float64)])
  rules.setdefault(lax.copy_p, lambda ctx, x: x)


def _pallas_block_sum(name: str, body: Callable[..., tuple[Array, ...]],
                      operands: list[tuple[Array, int, bool]],
                      outputs: list[tuple[jax.ShapeDtypeStruct, int]]) -> tuple[Array, ...]:
  """One Pallas kernel over the grid (outer block, batch, head) whose outputs are sums of `body`
  over the inner blocks: a program loads its outer tiles once, loops over the inner ones inside
  the kernel (`lax.fori_loop`), accumulating in registers, and writes each output tile once, so
  no two programs share an output tile and nothing depends on the order programs run in.

  Compiled (Triton) on a GPU; on CPU, which cannot compile Pallas, run by the Pallas
  interpreter. The choice is made per lowering platform (`lax.platform_dependent`), not from
  the default backend, so a program lowered for a GPU on a CPU host gets the compiled kernel.

  Args:
    name: the kernel's name (in profiles).
    body: one head's tiles of `operands` (`[block, d]` each) -> one part per output.
    operands: (array `[B, len, heads, d]`, block length, True if its blocks follow the outer
      grid axis, False if the kernel loops over them).
    outputs: (shape and dtype `[B, len, heads, d]`, block length), following the outer grid
      axis; the dtype is also the accumulator's.
  """
  arrays = [x for x, _, _ in operands]
  batch, _, heads, head_dim = arrays[0].shape
  num_outer = outputs[0][0].shape[1] // outputs[0][1]
  inner_block = next(block for _, block, outer in operands if not outer)
  num_inner = next(x.shape[1] // block for x, block, outer in operands if not outer)

  def tiles(length: int, width: int, outer: bool) -> pl.BlockSpec:
    if outer:  # [B, len, heads, d] -> the [block, d] tile of this program's block and head
      return pl.BlockSpec((None, length, None, width), lambda i, b, h: (b, i, h, 0))
    # The whole length of one head; the kernel reads it a tile at a time.
    return pl.BlockSpec((None, length * num_inner, None, width), lambda i, b, h: (b, 0, h, 0))

  def kernel(*refs):
    in_refs, out_refs = refs[:len(operands)], refs[len(operands):]
    fixed = [ref[...] if outer else None
             for ref, (_, _, outer) in zip(in_refs, operands, strict=True)]

    def add_inner_block(j: Array, sums: tuple[Array, ...]) -> tuple[Array, ...]:
      rows = pl.ds(pl.multiple_of(j * inner_block, inner_block), inner_block)
      parts = body(*(ref[rows, :] if tile is None else tile
                     for ref, tile in zip(in_refs, fixed, strict=True)))
      return tuple(s + p.astype(s.dtype) for s, p in zip(sums, parts, strict=True))

    sums = lax.fori_loop(0, num_inner, add_inner_block,
                         tuple(jnp.zeros(ref.shape, ref.dtype) for ref in out_refs))
    for ref, total in zip(out_refs, sums, strict=True):
      ref[...] = total

  def call(interpret: bool, *arrays: Array) -> tuple[Array, ...]:
    if not interpret:
      _extend_triton_lowering()
    return tuple(pl.pallas_call(
        kernel, grid=(num_outer, batch, heads),
        in_specs=[tiles(block, x.shape[3], outer) for x, block, outer in operands],
        out_specs=[tiles(block, shape.shape[3], True) for shape, block in outputs],
        out_shape=[shape for shape, _ in outputs], interpret=interpret, name=name,
        # Triton's usual choice for tiles of this size: more warps for the wider head.
        compiler_params=pltriton.CompilerParams(num_warps=4 if head_dim <= 64 else 8,
                                                num_stages=2))(*arrays))

  return lax.platform_dependent(*arrays, cpu=functools.partial(call, True),
                                default=functools.partial(call, False))


def _pallas_forward(spec: blockwise.BlockSpec, query: Array, key: Array, value: Array) -> Array:
  """The chunked forward pass as one Pallas kernel: grid (query block, batch, head), each
  program summing `BlockSpec.partial_output` over the key blocks (no running max, no
  denominator)."""
  out = jax.ShapeDtypeStruct((*query.shape[:-1], value.shape[-1]),
                             spec.output_dtype(query, key, value))
  (result,) = _pallas_block_sum(
      "pointwise_attention_fwd",
      lambda q, k, v: (spec.partial_output(q, k, v, attention.ONE_HEAD),),
      [(query, spec.q_block, True), (key, spec.k_block, False), (value, spec.k_block, False)],
      [(out, spec.q_block)])
  return result


def _tile_grads(spec: blockwise.BlockSpec, query: Array, key: Array, value: Array,
                d_out: Array) -> tuple[Array, Array, Array]:
  """(dq, dk, dv) of one head's tile pair (q, d_out `[bq, d]`; k, v `[bk, d]`): the VJP of
  `partial_output(q, k, v, ONE_HEAD)`, in float32.

  h's derivative is jax's (the VJP of `pointwise_weights`); the four matmuls are written out
  because jax.vjp would pair float32 cotangents with bf16 operands, which a GPU matmul does not
  take. As in a flash-attention backward, each matmul multiplies values in the inputs' dtype
  (bf16: the weights, the weights' gradient, d_out) and accumulates in float32; for float32
  inputs this is exactly the VJP.
  """
  low = value.dtype
  scores = attention.attention_logits(query, key, float32_scores=spec.float32_scores,
                                      precision=spec.precision, layout=attention.ONE_HEAD)
  weights, weights_vjp = jax.vjp(spec.tile_weights, scores)
  dot = functools.partial(jnp.einsum, precision=spec.precision,
                          preferred_element_type=jnp.promote_types(low, jnp.float32))
  d_out = d_out.astype(low)
  d_value = dot("qk,qd->kd", weights.astype(low), d_out)
  (d_scores,) = weights_vjp(dot("qd,kd->qk", d_out, value).astype(weights.dtype))
  d_scores = d_scores.astype(low)
  d_key = dot("qk,qd->kd", d_scores, attention.scaled_query(query))
  d_query = dot("qk,kd->qd", d_scores, key) / attention.sqrt_head_dim(query).astype(
      d_key.dtype)
  return d_query, d_key, d_value


def _pallas_backward(spec: blockwise.BlockSpec, query: Array, key: Array, value: Array,
                     d_out: Array) -> tuple[Array, Array, Array]:
  """The chunked backward pass as two Pallas kernels, each tile pair recomputed (`_tile_grads`):
  dq sums over key blocks (grid query block, batch, head), dk and dv over query blocks (grid key
  block, batch, head), so every output tile has one writer. Gradients are at least float32.
  d_out travels in the values' dtype (lossless for a bf16 model, whose output cotangent is
  bf16)."""
  d_out = d_out.astype(value.dtype)
  grad = lambda x: jax.ShapeDtypeStruct(  # noqa: E731
      x.shape, jnp.promote_types(x.dtype, jnp.float32))
  # Each kernel keeps the gradients it owns; the compiler drops the other tile's matmuls.
  dq_part = lambda q, k, v, dout: _tile_grads(spec, q, k, v, dout)[:1]  # noqa: E731
  dkv_parts = lambda q, k, v, dout: _tile_grads(spec, q, k, v, dout)[1:]  # noqa: E731

  (dq,) = _pallas_block_sum(
      "pointwise_attention_dq", dq_part,
      [(query, spec.q_block, True), (key, spec.k_block, False), (value, spec.k_block, False),
       (d_out, spec.q_block, True)],
      [(grad(query), spec.q_block)])
  dk, dv = _pallas_block_sum(
      "pointwise_attention_dkv", dkv_parts,
      [(query, spec.q_block, False), (key, spec.k_block, True), (value, spec.k_block, True),
       (d_out, spec.q_block, False)],
      [(grad(key), spec.k_block), (grad(value), spec.k_block)])
  return dq, dk, dv


_pallas_attention = blockwise.recomputing_vjp(_pallas_forward, _pallas_backward)


def pallas_pointwise_attention(query: Array, key: Array, value: Array, *,
                               activation: str = "relu", seqlen_alpha: float = 1.0,
                               block_size: int = 128, mask: Array | None = None,
                               dtype: Any = None, precision: Any = None,
                               float32_scores: bool = True) -> Array:
  """`blockwise.chunked_pointwise_attention` as fused Pallas kernels, forward and backward.

  The forward kernel computes each tile with `BlockSpec.partial_output`, i.e. the same
  `attention_logits`/`pointwise_weights` as every other path; the backward pass is a dq kernel and a
  dk/dv kernel that recompute the tiles (`_tile_grads`: their VJP, h's derivative by jax), so,
  as in chunked, only q, k and v are kept and memory is O(len). Compiled with Triton on a GPU,
  run by the Pallas interpreter on CPU (where it is tested). XLA does not split a compiled
  kernel over devices: with a batch sharded over several GPUs, call it inside `shard_map`.

  Args: as `blockwise.chunked_pointwise_attention`, except
    block_size: largest query and key tile, a power of two >= 16 (the default 128 x 128 suits a
      GPU); a shorter length gets the smallest such tile that covers it, and lengths are
      zero-padded to whole tiles.
  Returns:
    `[batch..., q_len, heads, v_dim]`.
  """
  attention.AttentionOptions(activation=activation, seqlen_alpha=seqlen_alpha, impl="pallas",
                             block_size=block_size)  # raises for bad values
  blockwise.reject_mask("pallas", mask)
  return blockwise.run_blockwise(_pallas_attention, query, key, value, split=_pallas_block_len,
                                 activation=activation, seqlen_alpha=seqlen_alpha,
                                 block_size=block_size, dtype=dtype, precision=precision,
                                 float32_scores=float32_scores)
