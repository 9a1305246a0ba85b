"""The GPU kernels of `attention_impl='pallas'`: pointwise attention as two Pallas Triton kernels.

Forward: grid (query tile, batch, head); a program divides its query tile by sqrt(head_dim)
once, loops over the key tiles summing `h(q k^T) v` in registers (no running max, no
denominator) and stores `c = L^-alpha` times the sum in the output dtype. Backward: ONE kernel,
grid (key tile, batch, head), five matrix multiplies per tile pair as in FlashAttention-2:
S^T = k q^T, dP^T = v d_out^T, dv += P^T d_out, dk += dS^T q, and dq^T += k^T dS^T, added
atomically into a float32 `[batch, heads, head_dim, q_len]` buffer (the key tiles of a query
tile are summed by different programs). Every product takes its operands as loaded or as
accumulated (the key tile is transposed once per program), so no register tile is transposed in
the loop; rows past the true lengths are masked in the loads and stores (no padding by XLA);
outputs are stored in their final dtype. Tiles and warps are chosen per kernel (`KernelConfig`).

dq's atomic float32 additions make its last bits depend on the order the programs run in (as in
FlashAttention-2's and cuDNN's default backward): a GPU run is not bit-reproducible in dq.

Why Triton, although jax 0.11 deprecates Pallas's Triton backend for Mosaic GPU: (1) these
kernels run in the Pallas interpreter on CPU, where CI tests them against a float64 reference
for every activation (tests/test_pallas_attention.py); Mosaic GPU kernels (warp-specialised
wgmma/TMA pipelines, as jax's Hopper flash-attention example `ops/gpu/attention_mgpu.py`) cannot
run there, so they would be untested outside a GPU; (2) Mosaic GPU needs a Hopper (sm_90a) or
newer GPU, Triton also serves A100s. Removing the Triton backend will need: the forward and
backward rewritten with `plgpu.kernel` (TMA copies of q/k/v tiles into shared memory,
`plgpu.wgmma` products with the accumulators in registers, a warpgroup per 64 query rows), dq
reduced with a TMA reduce-add instead of atomics, the row masks of the last tile kept, the
erfc/copy lowering rules below dropped or ported, and the tests marked `gpu` to run them.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from big_vision_relu.models import attention
from big_vision_relu.models.pallas_tiles import TileSpec, pow2_at_least, valid_rows

Array = jax.Array
DEFAULT_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """One kernel's launch: the tile a program owns (`outer` rows), the tiles it loops over
  (`inner` rows), Triton's warps and software-pipelining stages."""
  outer: int
  inner: int
  num_warps: int
  num_stages: int


def kernel_configs(spec: TileSpec, head_dim: int) -> tuple[KernelConfig, KernelConfig]:
  """(forward, backward) launches: tiles are powers of two >= 16, at most `block_size` (128 by
  default) and no larger than the lengths need (33 keys: one tile of 64). The forward keeps one
  [bq, d] accumulator and loops over 64-key tiles (4 warps up to head dim 64, 8 beyond); the
  backward keeps two ([bk, d]: dk, dv) beside its [bk, bq] S^T and dP^T tiles, so it loops over
  64-query tiles with 8 warps, to hold them in registers. Chosen, not yet tuned on a GPU
  (docs/benchmarks.md, section 6)."""
  block = spec.options.block_size or DEFAULT_BLOCK
  tile = lambda length, cap: min(cap, max(attention.MIN_PALLAS_BLOCK,  # noqa: E731
                                          pow2_at_least(length)))
  forward = KernelConfig(tile(spec.q_len, block), tile(spec.key_len, min(block, 64)),
                         num_warps=4 if head_dim <= 64 else 8, num_stages=3)
  backward = KernelConfig(tile(spec.key_len, block), tile(spec.q_len, min(block, 64)),
                          num_warps=8, num_stages=2)
  return forward, backward


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


def _tile_spec(rows: int, width: int) -> pl.BlockSpec:
  """`[B, len, heads, d]` -> the `[rows, width]` tile of grid point (tile i, batch b, head h);
  `width` may exceed d (a power of two for Triton), the excess masked."""
  return pl.BlockSpec((None, rows, None, width), lambda i, b, h: (b, i, h, 0))


def _head_spec(length: int, width: int) -> pl.BlockSpec:
  """`[B, len, heads, d]` -> one head's whole `[len, width]`, read a tile at a time."""
  return pl.BlockSpec((None, length, None, width), lambda i, b, h: (b, 0, h, 0))


def _load(tile, start: Array | int, length: int, head_dim: int) -> Array:
  """A `[rows, width]` tile (a ref or a view) whose first row is row `start` of its head, zero
  in the rows from `length` on and in the columns from `head_dim` on."""
  rows, width = tile.shape
  mask = valid_rows(start, rows, length) & (jnp.arange(width) < head_dim)[None, :]
  return pltriton.load(tile, mask=mask, other=0.0)


def _rows(ref, start: Array, rows: int):
  """The view of rows `start..start + rows` of a head's `[len, width]` ref."""
  return ref.at[pl.ds(start, rows), :]


def _store(ref, value: Array, start: Array, length: int, head_dim: int) -> None:
  """The rows of `value` before `length` (and its first `head_dim` columns) into `ref`."""
  mask = valid_rows(start, ref.shape[0], length) & (jnp.arange(ref.shape[1]) < head_dim)[None, :]
  pltriton.store(ref, value.astype(ref.dtype), mask=mask)


def _forward_kernel(q_ref, k_ref, v_ref, o_ref, *, spec: TileSpec, config: KernelConfig,
                    head_dim: int):
  q_start = pl.program_id(0) * config.outer
  query = attention.scaled_query(_load(q_ref, q_start, spec.q_len, head_dim), head_dim)

  def add_key_tile(j, total):
    start = pl.multiple_of(j * config.inner, config.inner)
    key = _load(_rows(k_ref, start, config.inner), start, spec.key_len, head_dim)
    value = _load(_rows(v_ref, start, config.inner), start, spec.key_len, head_dim)
    return total + spec.output_part(query, key, value)

  total = lax.fori_loop(0, pl.cdiv(spec.key_len, config.inner), add_key_tile,
                        jnp.zeros(o_ref.shape, jnp.float32))
  _store(o_ref, total * spec.scale, q_start, spec.q_len, head_dim)


def _backward_kernel(q_ref, k_ref, v_ref, do_ref, _, dk_ref, dv_ref, dqt_ref, *,
                     spec: TileSpec, config: KernelConfig, head_dim: int):
  k_start = pl.program_id(0) * config.outer
  key = attention.scaled_query(_load(k_ref, k_start, spec.key_len, head_dim), head_dim)
  key_t = key.T  # once per program: dq^T's left operand
  value = _load(v_ref, k_start, spec.key_len, head_dim)

  def add_query_tile(i, sums):
    d_key, d_value = sums
    start = pl.multiple_of(i * config.inner, config.inner)
    query = _load(_rows(q_ref, start, config.inner), start, spec.q_len, head_dim)
    d_out = _load(_rows(do_ref, start, config.inner), start, spec.q_len, head_dim)
    weights_t, d_scores_t = spec.transposed_grads(key, value, query, d_out)
    pltriton.atomic_add(dqt_ref, (slice(None), pl.ds(start, config.inner)),
                        spec.dot(key_t, d_scores_t))
    return d_key + spec.dot(d_scores_t, query), d_value + spec.dot(weights_t, d_out)

  zeros = jnp.zeros(dk_ref.shape, jnp.float32)
  d_key, d_value = lax.fori_loop(0, pl.cdiv(spec.q_len, config.inner), add_query_tile,
                                 (zeros, zeros))
  root_d = float(head_dim) ** 0.5
  _store(dk_ref, d_key * (spec.scale / root_d), k_start, spec.key_len, head_dim)
  _store(dv_ref, d_value * spec.scale, k_start, spec.key_len, head_dim)


def _call(kernel, name: str, config: KernelConfig, grid: tuple[int, ...], interpret: bool,
          **call_kw):
  if not interpret:
    _extend_triton_lowering()
  return pl.pallas_call(
      kernel, grid=grid, interpret=interpret, name=name,
      compiler_params=pltriton.CompilerParams(num_warps=config.num_warps,
                                              num_stages=config.num_stages), **call_kw)


def forward(spec: TileSpec, query: Array, key: Array, value: Array, *,
            interpret: bool = False) -> Array:
  """q `[B, Lq, heads, d]`, k/v `[B, Lk, heads, d]` -> `[B, Lq, heads, d]` in `spec.out_dtype`.
  `interpret`: run in the Pallas interpreter (CPU)."""
  spec = dataclasses.replace(spec, interpreted=bool(interpret))
  batch, _, heads, head_dim = query.shape
  config, _ = kernel_configs(spec, head_dim)
  width = pow2_at_least(head_dim)
  kernel = functools.partial(_forward_kernel, spec=spec, config=config, head_dim=head_dim)
  return _call(
      kernel, "pointwise_attention_fwd", config, (pl.cdiv(spec.q_len, config.outer), batch, heads),
      interpret, in_specs=[_tile_spec(config.outer, width), _head_spec(spec.key_len, width),
                           _head_spec(spec.key_len, width)],
      out_specs=_tile_spec(config.outer, width),
      out_shape=jax.ShapeDtypeStruct(query.shape, spec.out_dtype))(query, key, value)


def backward(spec: TileSpec, query: Array, key: Array, value: Array, d_out: Array, *,
             interpret: bool = False) -> tuple[Array, Array, Array]:
  """(dq, dk, dv) of `forward` for the output cotangent `d_out` `[B, Lq, heads, d]`, in the
  dtypes of q, k and v."""
  spec = dataclasses.replace(spec, interpreted=bool(interpret))
  batch, _, heads, head_dim = query.shape
  _, config = kernel_configs(spec, head_dim)
  width = pow2_at_least(head_dim)
  q_padded = pl.cdiv(spec.q_len, config.inner) * config.inner  # dq^T's columns: whole tiles
  dq_t = jnp.zeros((batch, heads, width, q_padded), jnp.float32)
  kernel = functools.partial(_backward_kernel, spec=spec, config=config, head_dim=head_dim)
  head_t = pl.BlockSpec((None, None, width, q_padded), lambda i, b, h: (b, h, 0, 0))
  d_key, d_value, dq_t = _call(
      kernel, "pointwise_attention_bwd", config,
      (pl.cdiv(spec.key_len, config.outer), batch, heads), interpret,
      in_specs=[_head_spec(spec.q_len, width), _tile_spec(config.outer, width),
                _tile_spec(config.outer, width), _head_spec(spec.q_len, width), head_t],
      out_specs=[_tile_spec(config.outer, width), _tile_spec(config.outer, width), head_t],
      out_shape=[jax.ShapeDtypeStruct(key.shape, key.dtype),
                 jax.ShapeDtypeStruct(value.shape, value.dtype), dq_t],
      input_output_aliases={4: 2})(query, key, value, d_out.astype(value.dtype), dq_t)
  # One XLA fusion: dq^T's valid block, times c, transposed and cast.
  d_query = jnp.einsum("bhdq->bqhd", dq_t[:, :, :head_dim, :spec.q_len]) * spec.scale
  return d_query.astype(query.dtype), d_key, d_value
