"""The TPU kernels of `attention_impl='pallas'`: pointwise attention as two Pallas Mosaic kernels.

Both run over `[batch, heads, len, head_dim]` arrays (a TPU tile's lanes take whole head dims;
XLA transposes the model's `[batch, len, heads, d]` to it), with tiles that are multiples of 128
rows, and keep no row statistic.
  forward   grid (batch, head, query tile, key tile): a float32 `[bq, d]` accumulator in VMEM
            sums `h(q k^T / sqrt(d)) v` over the key tiles (the innermost, sequential grid
            axis); the last key tile stores `c = L^-alpha` times it in the output dtype.
  backward  ONE kernel, grid (batch, head, key tile, query tile), five matrix multiplies per tile
            pair: S^T = k q^T, dP^T = v d_out^T, dv += P^T d_out, dk += dS^T q, dq += dS k.
            dk and dv accumulate in VMEM over the query tiles (inner axis); dq accumulates in a
            float32 `[len, d]` block of the head that stays in VMEM while the kernel sweeps all
            of the head's tile pairs, so no tile pair is computed twice, nothing is atomic, and
            the result does not depend on the order of the (parallel) batch and head axes.
The last tile of a length that is not a multiple of the tile reads past the array (the TPU's
block copies leave those rows undefined): the kernels zero them (`valid_rows`), so padded keys
add nothing although h(0) != 0 for gelu, softplus and sigmoid, and the scale keeps the true
length.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from big_vision_relu.models import attention
from big_vision_relu.models.pallas_tiles import TileSpec, valid_rows

Array = jax.Array
LANES = 128  # a TPU vector register's lanes: tiles are multiples of it
DEFAULT_BLOCK = 512
MIB = 1 << 20
# The backward's float32 dq block of one head, kept in VMEM (twice, double-buffered): up to
# L x head_dim = 4M (16384 tokens at head dim 256), 48 MiB of VMEM in all.
MAX_RESIDENT_DQ = 16 * MIB
TN = (((0,), (0,)), ((), ()))  # dot_general: a [k, m] x b [k, n] -> [m, n] (a transposed)


def tile_len(length: int, max_block: int | None) -> int:
  """The tile of a length: the fewest tiles of at most max(max_block, 128) rows (512 by
  default), each a multiple of 128, padded as little as that allows (197 -> one tile of 256;
  785 -> two of 512; 4096 -> eight of 512)."""
  cap = max(LANES, max_block or DEFAULT_BLOCK) // LANES * LANES
  num_tiles = pl.cdiv(length, cap)
  return pl.cdiv(pl.cdiv(length, num_tiles), LANES) * LANES


def _extend_mosaic_lowering() -> None:
  """Gives jax's Pallas-to-Mosaic lowering the two primitives of exact gelu that it lacks (jax
  0.10): `erfc` as 1 - erf (Mosaic has erf; the absolute error, < 1e-7, is what gelu's
  x * erfc(-x / sqrt 2) / 2 needs) and `copy` (an identity on values). Private jax API, as there
  is no public hook; a jax that has rules of its own keeps them."""
  from jax._src.pallas.mosaic import lowering as mosaic  # noqa: PLC0415 (TPU lowering only)
  rules = mosaic.lowering_rules[pltpu.CoreType.TC]
  rules.setdefault(lax.erfc_p, mosaic.lower_fun(lambda x, accuracy=None: 1 - lax.erf(x)))
  rules.setdefault(lax.copy_p, lambda ctx, x: x)


def _forward_kernel(q_ref, k_ref, v_ref, o_ref, total_ref, *, spec: TileSpec):
  j = pl.program_id(3)
  block_k = k_ref.shape[0]

  @pl.when(j == 0)
  def _():
    total_ref[...] = jnp.zeros_like(total_ref)

  valid = valid_rows(j * block_k, block_k, spec.key_len, k_ref.shape[1])
  key = jnp.where(valid, k_ref[...], 0)
  value = jnp.where(valid, v_ref[...], 0)
  total_ref[...] += spec.output_part(attention.scaled_query(q_ref[...]), key, value)

  @pl.when(j == pl.num_programs(3) - 1)
  def _():
    o_ref[...] = (total_ref[...] * spec.scale).astype(o_ref.dtype)


def _backward_kernel(q_ref, k_ref, v_ref, do_ref, dk_ref, dv_ref, dq_ref, dk_total, dv_total, *,
                     spec: TileSpec):
  j, i = pl.program_id(2), pl.program_id(3)
  block_k, block_q = k_ref.shape[0], q_ref.shape[0]

  @pl.when((j == 0) & (i == 0))
  def _():
    dq_ref[...] = jnp.zeros_like(dq_ref)

  @pl.when(i == 0)
  def _():
    dk_total[...] = jnp.zeros_like(dk_total)
    dv_total[...] = jnp.zeros_like(dv_total)

  k_valid = valid_rows(j * block_k, block_k, spec.key_len, k_ref.shape[1])
  q_valid = valid_rows(i * block_q, block_q, spec.q_len, q_ref.shape[1])
  key = attention.scaled_query(jnp.where(k_valid, k_ref[...], 0))
  value = jnp.where(k_valid, v_ref[...], 0)
  query = jnp.where(q_valid, q_ref[...], 0)
  d_out = jnp.where(q_valid, do_ref[...], 0)
  weights_t, d_scores_t = spec.transposed_grads(key, value, query, d_out)
  dv_total[...] += spec.dot(weights_t, d_out)
  dk_total[...] += spec.dot(d_scores_t, query)
  rows = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
  dq_ref[rows, :] += spec.dot(d_scores_t, key, TN)

  @pl.when(i == pl.num_programs(3) - 1)
  def _():
    root_d = float(k_ref.shape[1]) ** 0.5
    dk_ref[...] = (dk_total[...] * (spec.scale / root_d)).astype(dk_ref.dtype)
    dv_ref[...] = (dv_total[...] * spec.scale).astype(dv_ref.dtype)


def _heads_first(x: Array) -> Array:
  """`[B, len, heads, d]` -> `[B, heads, len, d]`."""
  return jnp.swapaxes(x, 1, 2)


def _tiles(rows: int, head_dim: int, *, inner: bool) -> pl.BlockSpec:
  """`[B, heads, len, d]` -> the `[rows, d]` tile at the index of the grid's third (outer) or
  fourth (`inner`) axis."""
  if inner:
    return pl.BlockSpec((None, None, rows, head_dim), lambda b, h, i, j: (b, h, j, 0))
  return pl.BlockSpec((None, None, rows, head_dim), lambda b, h, i, j: (b, h, i, 0))


def _call(kernel, name: str, interpret, semantics: tuple[str, ...], *,
          vmem_limit_bytes: int | None = None, **call_kw):
  if not interpret:
    _extend_mosaic_lowering()
  params = pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=vmem_limit_bytes)
  return pl.pallas_call(kernel, name=name, interpret=interpret, compiler_params=params,
                        **call_kw)


def forward(spec: TileSpec, query: Array, key: Array, value: Array, *,
            interpret: bool | pltpu.InterpretParams = False) -> Array:
  """q `[B, Lq, heads, d]`, k/v `[B, Lk, heads, d]` -> `[B, Lq, heads, d]` in `spec.out_dtype`.
  `interpret`: `pltpu.InterpretParams()` runs the kernel in Pallas's TPU interpreter (CPU)."""
  spec = dataclasses.replace(spec, interpreted=bool(interpret))
  batch, _, heads, head_dim = query.shape
  block_q = tile_len(spec.q_len, spec.options.block_size)
  block_k = tile_len(spec.key_len, spec.options.block_size)
  grid = (batch, heads, pl.cdiv(spec.q_len, block_q), pl.cdiv(spec.key_len, block_k))
  query_tiles, key_tiles = _tiles(block_q, head_dim, inner=False), _tiles(block_k, head_dim,
                                                                          inner=True)
  out = _call(functools.partial(_forward_kernel, spec=spec), "pointwise_attention_fwd",
              interpret, ("parallel", "parallel", "parallel", "arbitrary"), grid=grid,
              in_specs=[query_tiles, key_tiles, key_tiles], out_specs=query_tiles,
              out_shape=jax.ShapeDtypeStruct((batch, heads, spec.q_len, head_dim),
                                             spec.out_dtype),
              scratch_shapes=[pltpu.VMEM((block_q, head_dim), jnp.float32)],
              )(*map(_heads_first, (query, key, value)))
  return _heads_first(out)


def backward(spec: TileSpec, query: Array, key: Array, value: Array, d_out: Array, *,
             interpret: bool | pltpu.InterpretParams = False) -> tuple[Array, Array, Array]:
  """(dq, dk, dv) of `forward` for the output cotangent `d_out` `[B, Lq, heads, d]`, in the
  dtypes of q, k and v."""
  spec = dataclasses.replace(spec, interpreted=bool(interpret))
  batch, _, heads, head_dim = query.shape
  block_q = tile_len(spec.q_len, spec.options.block_size)
  block_k = tile_len(spec.key_len, spec.options.block_size)
  num_q = pl.cdiv(spec.q_len, block_q)
  dq_bytes = num_q * block_q * head_dim * 4
  if dq_bytes > MAX_RESIDENT_DQ:
    raise ValueError(
        f"attention_impl='pallas' on a TPU keeps one head's float32 dq in VMEM: {spec.q_len} "
        f"queries x head dim {head_dim} need {dq_bytes / MIB:.0f} MiB > "
        f"{MAX_RESIDENT_DQ // MIB} MiB. Use attention_impl='chunked' for this length.")
  grid = (batch, heads, pl.cdiv(spec.key_len, block_k), num_q)
  head = pl.BlockSpec((None, None, num_q * block_q, head_dim), lambda b, h, j, i: (b, h, 0, 0))
  query_tiles, key_tiles = _tiles(block_q, head_dim, inner=True), _tiles(block_k, head_dim,
                                                                         inner=False)
  d_key, d_value, d_query = _call(
      functools.partial(_backward_kernel, spec=spec), "pointwise_attention_bwd", interpret,
      ("parallel", "parallel", "arbitrary", "arbitrary"), grid=grid,
      in_specs=[query_tiles, key_tiles, key_tiles, query_tiles],
      out_specs=[key_tiles, key_tiles, head],
      out_shape=[jax.ShapeDtypeStruct((batch, heads, spec.key_len, head_dim), key.dtype),
                 jax.ShapeDtypeStruct((batch, heads, spec.key_len, head_dim), value.dtype),
                 jax.ShapeDtypeStruct((batch, heads, num_q * block_q, head_dim), jnp.float32)],
      scratch_shapes=[pltpu.VMEM((block_k, head_dim), jnp.float32)] * 2,
      # The double-buffered dq block on top of the tiles and their temporaries (a few MiB at
      # tiles of 512, inside the 16 MiB that TPUs give a kernel by default).
      vmem_limit_bytes=2 * dq_bytes + 16 * MIB,
  )(*map(_heads_first, (query, key, value, d_out.astype(value.dtype))))
  # One XLA fusion: dq's valid rows, times c, transposed and cast (the 1 / sqrt(d) is in k).
  d_query = d_query[:, :, :spec.q_len] * spec.scale
  return (_heads_first(d_query).astype(query.dtype), _heads_first(d_key),
          _heads_first(d_value))
