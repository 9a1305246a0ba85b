"""The blockwise paths of pointwise attention: chunked (key blocks) and seq_parallel (a ring).

Pointwise weights need no statistic of their row, so attention over a split key axis is the
plain sum of the attention over each part: out_i = sum_j w(q_i . k_j) v_j. The paths here are
that sum, over key blocks (chunked, and Pallas in pallas_attention.py) and over key shards
(seq_parallel), all of `BlockSpec.partial_output`, with the global `key_len` in the scale, so
they compute the dense path's function (models/attention.py):
  chunked       `chunked_pointwise_attention`: query blocks x key blocks; the output is a plain
                sum over key blocks (no running max, no denominator) and a custom VJP recomputes
                the blocks, so memory is O(len x block) instead of O(len^2).
  seq_parallel  `seq_parallel_pointwise_attention`: `shard_map` over a mesh axis for the sequence;
                key/value shards travel around a ring (`ppermute`) and the partial outputs are
                added where the queries live, so no row max or row sum is ever exchanged.
They are pointwise only (softmax's row statistics span every key), take no mask (a ViT has
none), and zero-pad lengths to whole blocks (the scale keeps the real key_len). Each is a
`recomputing_vjp` of a (forward, backward) pair: only q, k and v are kept for the backward pass.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from big_vision_relu.models import attention

Array = jax.Array
DEFAULT_BLOCK = 512  # chunked's blocks and seq_parallel's local blocks, without a block_size


@dataclasses.dataclass(frozen=True)
class BlockSpec:
  """What one (query block, key block) pair computes; static (hashable) for `custom_vjp`."""
  options: attention.AttentionOptions  # the attention's one validated options object
  key_len: int  # the GLOBAL number of keys (the scale's L): no block, shard or padding size
  q_block: int
  k_block: int

  def partial_output(self, query: Array, key: Array, value: Array,
                     layout: attention.Layout = attention.MULTI_HEAD) -> Array:
    """q `[B, bq, heads, d]`, k/v `[B, bk, heads, d]` -> this key block's share of the output
    `[B, bq, heads, dv]`, in the accumulation dtype (float32 for bf16 inputs). With
    `layout=ONE_HEAD`: one head's tiles, q `[bq, d]`, k/v `[bk, d]` -> `[bq, dv]`."""
    options = self.options
    weights = self.tile_weights(attention.attention_logits(
        query, key, float32_scores=options.float32_scores, precision=options.precision,
        layout=layout))
    return attention.weighted_sum(weights, value, precision=options.precision, layout=layout)

  def tile_weights(self, scores: Array) -> Array:
    """A block of scores -> its pointwise weights (the scale of the global key_len)."""
    return attention.pointwise_weights(scores, activation=self.options.activation,
                                       seqlen_alpha=self.options.seqlen_alpha,
                                       key_len=self.key_len)

  def output_dtype(self, query: Array, key: Array, value: Array) -> Any:
    """The accumulation dtype of `partial_output` for these inputs."""
    return jax.eval_shape(self.partial_output, query, key, value).dtype


def recomputing_vjp(forward: Callable[..., Array],
                    backward: Callable[..., tuple[Array, Array, Array]],
                    num_static: int = 1) -> Callable[..., Array]:
  """`forward(*static, query, key, value)` as a `jax.custom_vjp` function whose VJP is
  `backward(*static, query, key, value, d_out) -> (dq, dk, dv)`.

  The first `num_static` arguments are static (hashable: a `BlockSpec`, axis names, sizes).
  Only q, k and v are kept for the backward pass, which recomputes what it needs; the gradients
  (accumulated in at least float32) are returned in the dtypes of q, k and v.
  """
  @functools.partial(jax.custom_vjp, nondiff_argnums=tuple(range(num_static)))
  def attend(*args: Any) -> Array:
    return forward(*args)

  def attend_fwd(*args: Any) -> tuple[Array, tuple[Array, ...]]:
    return forward(*args), args[num_static:]

  def attend_bwd(*args: Any) -> tuple[Array, ...]:
    *static, residuals, d_out = args
    grads = backward(*static, *residuals, d_out)
    return tuple(g.astype(x.dtype) for g, x in zip(grads, residuals, strict=True))

  attend.defvjp(attend_fwd, attend_bwd)
  return attend


def block_len(length: int, max_block: int) -> tuple[int, int]:
  """(block, padded length): the fewest blocks of at most max_block, padded as little as
  possible (197 tokens with max_block 128 -> 2 blocks of 99, not 2 of 128)."""
  num_blocks = -(-length // max_block)
  block = -(-length // num_blocks)
  return block, num_blocks * block


def _to_blocks(x: Array, block: int) -> Array:
  """`[B, n * block, heads, d]` -> `[n, B, block, heads, d]` (the leading axis is looped over)."""
  b, length, *rest = x.shape
  return jnp.moveaxis(x.reshape(b, length // block, block, *rest), 1, 0)


def _from_blocks(x: Array) -> Array:
  """`[n, B, block, heads, d]` -> `[B, n * block, heads, d]`."""
  n, b, block, *rest = x.shape
  return jnp.moveaxis(x, 0, 1).reshape(b, n * block, *rest)


def _blocked_forward(spec: BlockSpec, query: Array, key: Array, value: Array) -> Array:
  """Padded q `[B, Lq, heads, d]`, k/v `[B, Lk, heads, d]` -> `[B, Lq, heads, dv]` (accumulation
  dtype): a map over query blocks of a loop over key blocks. Only one `[B, heads, bq, bk]`
  block of weights exists at a time."""
  key_blocks, value_blocks = _to_blocks(key, spec.k_block), _to_blocks(value, spec.k_block)

  def one_query_block(q: Array) -> Array:
    def add_key_block(j: Array, out: Array) -> Array:
      return out + spec.partial_output(q, key_blocks[j], value_blocks[j])
    # Starting from block 0 rather than zeros gives the accumulator the right dtype and, inside
    # shard_map, the right varying-axes type.
    first = spec.partial_output(q, key_blocks[0], value_blocks[0])
    return lax.fori_loop(1, key_blocks.shape[0], add_key_block, first)

  return _from_blocks(lax.map(one_query_block, _to_blocks(query, spec.q_block)))


def _blocked_backward(spec: BlockSpec, query: Array, key: Array, value: Array,
                      d_out: Array) -> tuple[Array, Array, Array]:
  """Gradients (dq, dk, dv) of `_blocked_forward` for the output cotangent `d_out`, each block
  pair recomputed (nothing of the forward pass is kept but q, k, v).

  One pass over the block pairs, key blocks outside: dk and dv of a key block accumulate in the
  inner loop's carry, dq of every query block in the outer carry. The block's VJP is that of
  `BlockSpec.partial_output` itself, so the backward differentiates exactly the forward's
  function (and `pointwise_weights`' h) without a hand-written derivative. Gradients are
  accumulated in at least float32 and returned in that dtype.
  """
  q_blocks, k_blocks, v_blocks = (_to_blocks(query, spec.q_block), _to_blocks(key, spec.k_block),
                                  _to_blocks(value, spec.k_block))
  dout_blocks = _to_blocks(d_out.astype(spec.output_dtype(query, key, value)), spec.q_block)
  grad = lambda x: jnp.zeros_like(x, jnp.promote_types(x.dtype, jnp.float32))  # noqa: E731

  def one_key_block(dq_blocks: Array, kv: tuple[Array, Array]):
    k, v = kv

    def one_query_block(dkv: tuple[Array, Array], qd: tuple[Array, Array, Array]):
      q, dout, dq = qd
      _, vjp = jax.vjp(spec.partial_output, q, k, v)
      gq, gk, gv = vjp(dout)
      return (dkv[0] + gk, dkv[1] + gv), dq + gq

    (dk, dv), dq_blocks = lax.scan(one_query_block, (grad(k), grad(v)),
                                   (q_blocks, dout_blocks, dq_blocks))
    return dq_blocks, (dk, dv)

  dq_blocks, (dk_blocks, dv_blocks) = lax.scan(one_key_block, grad(q_blocks),
                                               (k_blocks, v_blocks))
  return _from_blocks(dq_blocks), _from_blocks(dk_blocks), _from_blocks(dv_blocks)


_blocked_attention = recomputing_vjp(_blocked_forward, _blocked_backward)


def _ring_rotate(tree: Any, axis: str, size: int) -> Any:
  """Every device sends `tree` to the next one along the mesh axis `axis` (a ring)."""
  return lax.ppermute(tree, axis, [(i, (i + 1) % size) for i in range(size)])


def _ring_forward(spec: BlockSpec, axis: str, size: int, query: Array, key: Array,
                  value: Array) -> Array:
  """Per-device shards -> this device's output shard: the local key shard, then size - 1
  shards arriving from the previous device, each added to the output; only k and v move."""
  def step(carry, _):
    out, k, v = carry
    k, v = _ring_rotate((k, v), axis, size)
    return (out + _blocked_forward(spec, query, k, v), k, v), None

  first = _blocked_forward(spec, query, key, value)
  return lax.scan(step, (first, key, value), length=size - 1)[0][0]


def _ring_backward(spec: BlockSpec, axis: str, size: int, query: Array, key: Array,
                   value: Array, d_out: Array) -> tuple[Array, Array, Array]:
  """The ring in reverse roles: k, v and their gradients stay, while each query shard travels
  with its output cotangent and a dq accumulator, which is back on the shard's own device after
  size - 1 hops. Three shards move per hop instead of four (k, v, dk, dv)."""
  dq_local, dk, dv = _blocked_backward(spec, query, key, value, d_out)

  def step(carry, _):
    q, dout, dq, dk, dv = carry
    q, dout = _ring_rotate((q, dout), axis, size)
    gq, gk, gv = _blocked_backward(spec, q, key, value, dout)
    return (q, dout, _ring_rotate(dq + gq, axis, size), dk + gk, dv + gv), None

  init = (query, d_out, jnp.zeros_like(dq_local), dk, dv)
  _, _, dq, dk, dv = lax.scan(step, init, length=size - 1)[0]
  return dq_local + dq, dk, dv


_ring_attention = recomputing_vjp(_ring_forward, _ring_backward, num_static=3)


def reject_mask(impl: str, mask: Array | None) -> None:
  """Raises ValueError for a mask: the blockwise paths take none."""
  if mask is not None:
    raise ValueError(f"attention_impl={impl!r} takes no mask (a ViT needs none); use "
                     "attention_impl='dense' for masked attention.")


def _flatten_and_pad(x: Array, length: int) -> Array:
  """`[batch..., len, heads, d]` -> `[B, length, heads, d]`, zeros appended along len.

  Zero keys and values are how the blockwise paths pad: a padded key's weight h(q . 0) = h(0)
  is finite (not 0 for gelu, softplus or sigmoid) and multiplies a zero value, so it adds
  exactly 0 to every output, and its score gradient (d_out . v = 0) is exactly 0 too; a padded
  query's output is sliced off, so its cotangent is 0 and it adds 0 to dk and dv. The scale
  keeps the unpadded key_len.
  """
  x = x.reshape(-1, *x.shape[-3:])
  return jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)))


def run_blockwise(core: Callable[[BlockSpec, Array, Array, Array], Array],
                  options: attention.AttentionOptions, query: Array, key: Array, value: Array,
                  *, default_block: int, dtype: Any, parts: int = 1,
                  split: Callable[[int, int], tuple[int, int]] = block_len) -> Array:
  """Runs `core(spec, q, k, v)` on `[B, len, heads, d]` arrays whose lengths are zero-padded to
  `parts` equal pieces (devices) of whole blocks (`split(piece length, options.block_size or
  default_block)` -> (block, padded piece length)), and undoes the padding and the batch
  flattening: `[batch..., q_len, heads, v_dim]` in `dtype`."""
  q_len, k_len = query.shape[-3], key.shape[-3]
  max_block = options.block_size or default_block
  q_block, q_part = split(-(-q_len // parts), max_block)
  k_block, k_part = split(-(-k_len // parts), max_block)
  spec = BlockSpec(options, k_len, q_block, k_block)
  out = core(spec, _flatten_and_pad(query, parts * q_part), _flatten_and_pad(key, parts * k_part),
             _flatten_and_pad(value, parts * k_part))
  return out[:, :q_len].reshape(*query.shape[:-1], value.shape[-1]).astype(dtype or value.dtype)


def chunked_pointwise_attention(options: attention.AttentionOptions, query: Array, key: Array,
                                value: Array, *, mask: Array | None = None,
                                dtype: Any = None) -> Array:
  """Pointwise attention in query x key blocks of at most `options.block_size` (default 512):
  the same function as `attention.dense_attention`, memory O(len x block) in the forward and
  backward passes.

  Args:
    options: `AttentionOptions(impl='chunked', ...)`, a pointwise activation; lengths are split
      into equal blocks with the least zero padding.
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., k_len, heads, head_dim]`.
    value: `[batch..., k_len, heads, v_dim]`.
    mask: must be None.
    dtype: output dtype (default: the values' dtype).
  Returns:
    `[batch..., q_len, heads, v_dim]`.
  """
  options.require_impl("chunked")
  reject_mask("chunked", mask)
  return run_blockwise(_blocked_attention, options, query, key, value,
                       default_block=DEFAULT_BLOCK, dtype=dtype)


def seq_parallel_pointwise_attention(options: attention.AttentionOptions, query: Array,
                                     key: Array, value: Array, *, mask: Array | None = None,
                                     dtype: Any = None) -> Array:
  """Pointwise attention with the sequence split over the mesh axis `options.seq_axis` (ring
  attention).

  Inside a `shard_map` that is manual over `seq_axis` only (other axes, e.g. the batch's 'data',
  stay with the compiler), each device keeps its query shard; key/value shards travel around the
  ring with `ppermute` and each partial output is added to the local sum. Local blocks are
  computed as in `chunked_pointwise_attention`. A custom VJP runs the ring again in the backward
  pass, there with the query shards, their output cotangents and dq travelling, so no device
  ever holds more than one remote shard of anything. Lengths are zero-padded to a multiple of
  the axis size (times the local block).

  Args:
    options: `AttentionOptions(impl='seq_parallel', ...)`: its `mesh` (None: the context mesh,
      `jax.set_mesh`), `seq_axis` and `block_size` (the local blocks, default 512).
    query, key, value, mask, dtype: as in `chunked_pointwise_attention` (`[batch..., len,
      heads, d]`).
  Returns:
    `[batch..., q_len, heads, v_dim]`, sharded over `seq_axis` along q_len.
  """
  options.require_impl("seq_parallel")
  reject_mask("seq_parallel", mask)
  if options.mesh is None:  # the context mesh, known at trace time; validated against seq_axis
    options = dataclasses.replace(options, mesh=jax.sharding.get_abstract_mesh())
  mesh, seq_axis = options.mesh, options.seq_axis
  size = mesh.shape[seq_axis]
  sharded = P(None, seq_axis)  # [B, len, heads, d]: len split over the ring

  def ring(spec, q, k, v):
    return jax.shard_map(functools.partial(_ring_attention, spec, seq_axis, size), mesh=mesh,
                         in_specs=(sharded, sharded, sharded), out_specs=sharded,
                         axis_names={seq_axis})(q, k, v)

  return run_blockwise(ring, options, query, key, value, parts=size,
                       default_block=DEFAULT_BLOCK, dtype=dtype)
