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

Four implementations (`ATTENTION_IMPLS`):
  dense         `pointwise_attention`: the `[batch, heads, q_len, k_len]` weights are materialised.
  chunked       `chunked_pointwise_attention`: query blocks x key blocks; the output is a plain
                sum over key blocks (no running max, no denominator) and a custom VJP recomputes
                the blocks, so memory is O(len x block) instead of O(len^2).
  seq_parallel  `seq_parallel_pointwise_attention`: `shard_map` over a mesh axis for the sequence;
                key/value shards travel around a ring (`ppermute`) and the partial outputs are
                added where the queries live, so no row max or row sum is ever exchanged.
  pallas        `pallas_pointwise_attention`: chunked as fused Pallas kernels, forward and
                backward (Triton on a GPU; on CPU the Pallas interpreter, where it is tested).
The blockwise paths are pointwise only (softmax's row statistics span every key), take no mask
(a ViT has none), and zero-pad lengths to whole blocks (the scale keeps the real key_len).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jax.sharding import PartitionSpec as P

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
ATTENTION_IMPLS: tuple[str, ...] = ("dense", "chunked", "seq_parallel", "pallas")

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


def _require_pointwise(what: str, activation: str) -> None:
  if activation == "softmax":
    raise ValueError(
        f"{what} needs a pointwise attention ({', '.join(ACTIVATIONS)}): softmax's row max and "
        "denominator span all keys, so its key blocks cannot simply be added. Valid "
        "combinations: attention_impl='dense' with any attention; 'chunked', 'seq_parallel' and "
        "'pallas' with the pointwise ones.")


def validate_attention_impl(impl: str, activation: str) -> None:
  """Raises ValueError for an unknown implementation or softmax with a blockwise one."""
  if impl not in ATTENTION_IMPLS:
    raise ValueError(f"Unknown attention_impl {impl!r}; valid: {', '.join(ATTENTION_IMPLS)}.")
  if impl != "dense":
    _require_pointwise(f"attention_impl={impl!r}", activation)


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


# einsum subscripts of (scores, weighted sum): for `[batch..., len, heads, d]` arrays, and for
# one head's `[len, d]` tiles (inside a Pallas kernel, whose GPU lowering takes 2-D dots only).
_MULTI_HEAD = ("...qhd,...khd->...hqk", "...hqk,...khd->...qhd")
_ONE_HEAD = ("qd,kd->qk", "qk,kd->qd")


def _sqrt_head_dim(query: Array) -> Array:
  """sqrt(head_dim) in q's dtype: the scores are (q / this) . k."""
  return jnp.sqrt(query.shape[-1]).astype(query.dtype)


def _scaled_query(query: Array) -> Array:
  """q / sqrt(head_dim) in q's dtype, computed in float32 and rounded back: the same bits as a
  bf16 division (float32 has over twice bf16's precision, so the double rounding is exact), and
  the form a Pallas GPU kernel lowers (Triton divides no bf16)."""
  wide = jnp.promote_types(query.dtype, jnp.float32)
  return (query.astype(wide) / _sqrt_head_dim(query)).astype(query.dtype)


def _scores(query: Array, key: Array, *, float32: bool, precision: Any,
            subscripts: str = _MULTI_HEAD[0]) -> Array:
  """[batch..., q, heads, d] x [batch..., k, heads, d] -> [batch..., heads, q, k] / sqrt(d)
  (`_ONE_HEAD[0]`: [q, d] x [k, d] -> [q, k])."""
  compute_dtype = jnp.result_type(query, key)
  if float32:  # at least float32: bfloat16 is upcast, float64 stays float64.
    compute_dtype = jnp.promote_types(compute_dtype, jnp.float32)
  return jnp.einsum(subscripts, _scaled_query(query), key, precision=precision,
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


def _weighted_sum(weights: Array, value: Array, *, precision: Any,
                  subscripts: str = _MULTI_HEAD[1]) -> Array:
  """Weights [..., heads, q, k] x value [..., k, heads, d] -> [..., q, heads, d] (`_ONE_HEAD[1]`:
  [q, k] x [k, d] -> [q, d]).

  The product runs in value's dtype (bf16 on TPU) and accumulates in float32 when the weights
  were kept in float32; the result keeps that accumulation dtype.
  """
  return jnp.einsum(subscripts, weights.astype(value.dtype), value, precision=precision,
                    preferred_element_type=jnp.promote_types(weights.dtype, value.dtype))


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
  return _weighted_sum(weights, value, precision=precision).astype(dtype or value.dtype)


# ------------------------------------------------------------------------ blockwise paths
#
# Pointwise weights need no statistic of their row, so attention over a split key axis is the
# plain sum of the attention over each part: out_i = sum_j w(q_i . k_j) v_j. The blockwise
# paths below are that sum, over key blocks (chunked, Pallas) and over key shards
# (seq_parallel), all of `_BlockSpec.partial_output`.


@dataclasses.dataclass(frozen=True)
class _BlockSpec:
  """What one (query block, key block) pair computes; static (hashable) for `custom_vjp`."""
  activation: str
  seqlen_alpha: float
  key_len: int  # the GLOBAL number of keys (the scale's L): no block, shard or padding size
  float32_scores: bool
  precision: Any
  q_block: int
  k_block: int

  def partial_output(self, query: Array, key: Array, value: Array,
                     layout: tuple[str, str] = _MULTI_HEAD) -> Array:
    """q `[B, bq, heads, d]`, k/v `[B, bk, heads, d]` -> this key block's share of the output
    `[B, bq, heads, dv]`, in the accumulation dtype (float32 for bf16 inputs). With
    `layout=_ONE_HEAD`: one head's tiles, q `[bq, d]`, k/v `[bk, d]` -> `[bq, dv]`."""
    scores = _scores(query, key, float32=self.float32_scores, precision=self.precision,
                     subscripts=layout[0])
    weights = pointwise_weights(scores, activation=self.activation,
                                seqlen_alpha=self.seqlen_alpha, key_len=self.key_len)
    return _weighted_sum(weights, value, precision=self.precision, subscripts=layout[1])

  def output_dtype(self, query: Array, key: Array, value: Array) -> Any:
    """The accumulation dtype of `partial_output` for these inputs."""
    return jax.eval_shape(self.partial_output, query, key, value).dtype


def _block_len(length: int, max_block: int) -> tuple[int, int]:
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


def _blocked_forward(spec: _BlockSpec, query: Array, key: Array, value: Array) -> Array:
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


def _blocked_backward(spec: _BlockSpec, query: Array, key: Array, value: Array,
                      d_out: Array) -> tuple[Array, Array, Array]:
  """Gradients (dq, dk, dv) of `_blocked_forward` for the output cotangent `d_out`, each block
  pair recomputed (nothing of the forward pass is kept but q, k, v).

  One pass over the block pairs, key blocks outside: dk and dv of a key block accumulate in the
  inner loop's carry, dq of every query block in the outer carry. The block's VJP is that of
  `_BlockSpec.partial_output` itself, so the backward differentiates exactly the forward's
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blocked_attention(spec: _BlockSpec, query: Array, key: Array, value: Array) -> Array:
  return _blocked_forward(spec, query, key, value)


def _blocked_attention_fwd(spec, query, key, value):
  return _blocked_forward(spec, query, key, value), (query, key, value)


def _blocked_attention_bwd(spec, residuals, d_out):
  grads = _blocked_backward(spec, *residuals, d_out)
  return tuple(g.astype(x.dtype) for g, x in zip(grads, residuals, strict=True))


_blocked_attention.defvjp(_blocked_attention_fwd, _blocked_attention_bwd)


def _ring_rotate(tree: Any, axis: str, size: int) -> Any:
  """Every device sends `tree` to the next one along the mesh axis `axis` (a ring)."""
  return lax.ppermute(tree, axis, [(i, (i + 1) % size) for i in range(size)])


def _ring_forward(spec: _BlockSpec, axis: str, size: int, query: Array, key: Array,
                  value: Array) -> Array:
  """Per-device shards -> this device's output shard: the local key shard, then size - 1
  shards arriving from the previous device, each added to the output; only k and v move."""
  def step(carry, _):
    out, k, v = carry
    k, v = _ring_rotate((k, v), axis, size)
    return (out + _blocked_forward(spec, query, k, v), k, v), None

  first = _blocked_forward(spec, query, key, value)
  return lax.scan(step, (first, key, value), length=size - 1)[0][0]


def _ring_backward(spec: _BlockSpec, axis: str, size: int, query: Array, key: Array,
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _ring_attention(spec: _BlockSpec, axis: str, size: int, query: Array, key: Array,
                    value: Array) -> Array:
  return _ring_forward(spec, axis, size, query, key, value)


def _ring_attention_fwd(spec, axis, size, query, key, value):
  return _ring_forward(spec, axis, size, query, key, value), (query, key, value)


def _ring_attention_bwd(spec, axis, size, residuals, d_out):
  grads = _ring_backward(spec, axis, size, *residuals, d_out)
  return tuple(g.astype(x.dtype) for g, x in zip(grads, residuals, strict=True))


_ring_attention.defvjp(_ring_attention_fwd, _ring_attention_bwd)


def _check_blockwise(what: str, activation: str, seqlen_alpha: float, mask: Array | None,
                     block_size: int) -> None:
  validate_attention(activation, seqlen_alpha)
  _require_pointwise(what, activation)
  if mask is not None:
    raise ValueError(f"{what} takes no mask (a ViT needs none); use attention_impl='dense' for "
                     "masked attention.")
  if not (isinstance(block_size, int) and block_size >= 1):
    raise ValueError(f"block_size must be a positive int, got {block_size!r}.")


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


def _blockwise_call(core: Callable[[_BlockSpec, Array, Array, Array], Array], query: Array,
                    key: Array, value: Array, *, parts: int = 1,
                    block_len: Callable[[int, int], tuple[int, int]] = _block_len,
                    activation: str, seqlen_alpha: float, block_size: int, dtype: Any,
                    precision: Any, float32_scores: bool) -> Array:
  """Runs `core(spec, q, k, v)` on `[B, len, heads, d]` arrays whose lengths are zero-padded to
  `parts` equal pieces (devices) of whole blocks (`block_len(piece length, block_size)` ->
  (block, padded piece length)), and undoes the padding and the batch flattening:
  `[batch..., q_len, heads, v_dim]` in `dtype`."""
  q_len, k_len = query.shape[-3], key.shape[-3]
  q_block, q_part = block_len(-(-q_len // parts), block_size)
  k_block, k_part = block_len(-(-k_len // parts), block_size)
  spec = _BlockSpec(activation, float(seqlen_alpha), k_len, float32_scores, precision,
                    q_block, k_block)
  out = core(spec, _flatten_and_pad(query, parts * q_part), _flatten_and_pad(key, parts * k_part),
             _flatten_and_pad(value, parts * k_part))
  return out[:, :q_len].reshape(*query.shape[:-1], value.shape[-1]).astype(dtype or value.dtype)


def chunked_pointwise_attention(query: Array, key: Array, value: Array, *,
                                activation: str = "relu", seqlen_alpha: float = 1.0,
                                block_size: int = 512, mask: Array | None = None,
                                dtype: Any = None, precision: Any = None,
                                float32_scores: bool = True) -> Array:
  """Pointwise attention in query x key blocks of at most `block_size`: the same function as
  `pointwise_attention`, memory O(len x block) in the forward and backward passes.

  Args:
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., k_len, heads, head_dim]`.
    value: `[batch..., k_len, heads, v_dim]`.
    activation: a pointwise one (not softmax).
    seqlen_alpha: weights are `k_len ** -seqlen_alpha * h(q.k / sqrt(head_dim))`.
    block_size: largest query and key block; lengths are split into equal blocks with the
      least zero padding.
    mask: must be None.
    dtype, precision, float32_scores: as in `pointwise_attention`.
  Returns:
    `[batch..., q_len, heads, v_dim]`.
  """
  _check_blockwise("attention_impl='chunked'", activation, seqlen_alpha, mask, block_size)
  return _blockwise_call(_blocked_attention, query, key, value, activation=activation,
                         seqlen_alpha=seqlen_alpha, block_size=block_size, dtype=dtype,
                         precision=precision, float32_scores=float32_scores)


def seq_parallel_pointwise_attention(query: Array, key: Array, value: Array, *,
                                     activation: str = "relu", seqlen_alpha: float = 1.0,
                                     mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh
                                     | None = None,
                                     seq_axis: str = "seq", block_size: int = 512,
                                     mask: Array | None = None, dtype: Any = None,
                                     precision: Any = None, float32_scores: bool = True
                                     ) -> Array:
  """Pointwise attention with the sequence split over the mesh axis `seq_axis` (ring attention).

  Inside a `shard_map` that is manual over `seq_axis` only (other axes, e.g. the batch's 'data',
  stay with the compiler), each device keeps its query shard; key/value shards travel around the
  ring with `ppermute` and each partial output is added to the local sum. Local blocks are
  computed as in `chunked_pointwise_attention`. A custom VJP runs the ring again in the backward
  pass, there with the query shards, their output cotangents and dq travelling, so no device
  ever holds more than one remote shard of anything. Lengths are zero-padded to a multiple of
  the axis size (times the local block).

  Args:
    query, key, value, activation, seqlen_alpha, block_size, mask, dtype, precision,
      float32_scores: as in `chunked_pointwise_attention` (`[batch..., len, heads, d]`).
    mesh: the device mesh; None takes the context mesh (`jax.set_mesh`).
    seq_axis: the mesh axis the sequence is split over.
  Returns:
    `[batch..., q_len, heads, v_dim]`, sharded over `seq_axis` along q_len.
  """
  _check_blockwise("attention_impl='seq_parallel'", activation, seqlen_alpha, mask, block_size)
  mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
  if seq_axis not in mesh.axis_names:
    raise ValueError(
        f"attention_impl='seq_parallel' needs a mesh with the sequence axis {seq_axis!r}; got "
        f"axes {tuple(mesh.axis_names)}. Pass mesh= (e.g. [('data', 2), ('seq', 4)]) or run "
        "under jax.set_mesh(mesh).")
  size = mesh.shape[seq_axis]
  sharded = P(None, seq_axis)  # [B, len, heads, d]: len split over the ring

  def ring(spec, q, k, v):
    return jax.shard_map(functools.partial(_ring_attention, spec, seq_axis, size), mesh=mesh,
                         in_specs=(sharded, sharded, sharded), out_specs=sharded,
                         axis_names={seq_axis})(q, k, v)

  return _blockwise_call(ring, query, key, value, parts=size, activation=activation,
                         seqlen_alpha=seqlen_alpha, block_size=block_size, dtype=dtype,
                         precision=precision, float32_scores=float32_scores)


# ----------------------------------------------------------------------------------- Pallas

_MIN_PALLAS_BLOCK = 16  # the smallest tile of a GPU matrix multiply (Triton's tl.dot)


def _pallas_block_len(length: int, max_block: int) -> tuple[int, int]:
  """(block, padded length) of the Pallas kernels: a power of two (GPU tile shapes are), at
  least 16, at most `max_block` and no larger than the length needs: 197 with max_block 128 ->
  2 blocks of 128; 33 -> 1 block of 64; 1 -> 1 block of 16."""
  block = min(max_block, max(_MIN_PALLAS_BLOCK, 1 << (length - 1).bit_length()))
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


def _pallas_forward(spec: _BlockSpec, query: Array, key: Array, value: Array) -> Array:
  """`_blocked_forward` as one Pallas kernel: grid (query block, batch, head), each program
  summing `_BlockSpec.partial_output` over the key blocks (no running max, no denominator)."""
  out = jax.ShapeDtypeStruct((*query.shape[:-1], value.shape[-1]),
                             spec.output_dtype(query, key, value))
  (result,) = _pallas_block_sum(
      "pointwise_attention_fwd", lambda q, k, v: (spec.partial_output(q, k, v, _ONE_HEAD),),
      [(query, spec.q_block, True), (key, spec.k_block, False), (value, spec.k_block, False)],
      [(out, spec.q_block)])
  return result


def _tile_grads(spec: _BlockSpec, query: Array, key: Array, value: Array,
                d_out: Array) -> tuple[Array, Array, Array]:
  """(dq, dk, dv) of one head's tile pair (q, d_out `[bq, d]`; k, v `[bk, d]`): the VJP of
  `partial_output(q, k, v, _ONE_HEAD)`, in float32.

  h's derivative is jax's (the VJP of `pointwise_weights`); the four matmuls are written out
  because jax.vjp would pair float32 cotangents with bf16 operands, which a GPU matmul does not
  take. As in a flash-attention backward, each matmul multiplies values in the inputs' dtype
  (bf16: the weights, the weights' gradient, d_out) and accumulates in float32; for float32
  inputs this is exactly the VJP.
  """
  low = value.dtype
  scores = _scores(query, key, float32=spec.float32_scores, precision=spec.precision,
                   subscripts=_ONE_HEAD[0])
  weights, weights_vjp = jax.vjp(functools.partial(
      pointwise_weights, activation=spec.activation, seqlen_alpha=spec.seqlen_alpha,
      key_len=spec.key_len), scores)
  dot = functools.partial(jnp.einsum, precision=spec.precision,
                          preferred_element_type=jnp.promote_types(low, jnp.float32))
  d_out = d_out.astype(low)
  d_value = dot("qk,qd->kd", weights.astype(low), d_out)
  (d_scores,) = weights_vjp(dot("qd,kd->qk", d_out, value).astype(weights.dtype))
  d_scores = d_scores.astype(low)
  d_key = dot("qk,qd->kd", d_scores, _scaled_query(query))
  d_query = dot("qk,kd->qd", d_scores, key) / _sqrt_head_dim(query).astype(d_key.dtype)
  return d_query, d_key, d_value


def _pallas_backward(spec: _BlockSpec, query: Array, key: Array, value: Array,
                     d_out: Array) -> tuple[Array, Array, Array]:
  """`_blocked_backward` as two Pallas kernels, each tile pair recomputed (`_tile_grads`): dq
  sums over key blocks (grid query block, batch, head), dk and dv over query blocks (grid key
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pallas_attention(spec: _BlockSpec, query: Array, key: Array, value: Array) -> Array:
  return _pallas_forward(spec, query, key, value)


def _pallas_attention_fwd(spec, query, key, value):
  return _pallas_forward(spec, query, key, value), (query, key, value)


def _pallas_attention_bwd(spec, residuals, d_out):
  grads = _pallas_backward(spec, *residuals, d_out)
  return tuple(g.astype(x.dtype) for g, x in zip(grads, residuals, strict=True))


_pallas_attention.defvjp(_pallas_attention_fwd, _pallas_attention_bwd)


def pallas_pointwise_attention(query: Array, key: Array, value: Array, *,
                               activation: str = "relu", seqlen_alpha: float = 1.0,
                               block_size: int = 128, mask: Array | None = None,
                               dtype: Any = None, precision: Any = None,
                               float32_scores: bool = True) -> Array:
  """`chunked_pointwise_attention` as fused Pallas kernels, forward and backward.

  The forward kernel computes each tile with `_BlockSpec.partial_output`, i.e. the same
  `_scores`/`pointwise_weights` as every other path; the backward pass is a dq kernel and a
  dk/dv kernel that recompute the tiles (`_tile_grads`: their VJP, h's derivative by jax), so,
  as in chunked, only q, k and v are kept and memory is O(len). Compiled with Triton on a GPU,
  run by the Pallas interpreter on CPU (where it is tested). XLA does not split a compiled
  kernel over devices: with a batch sharded over several GPUs, call it inside `shard_map`.

  Args: as `chunked_pointwise_attention`, except
    block_size: largest query and key tile, a power of two >= 16 (the default 128 x 128 suits a
      GPU); a shorter length gets the smallest such tile that covers it, and lengths are
      zero-padded to whole tiles.
  Returns:
    `[batch..., q_len, heads, v_dim]`.
  """
  _check_blockwise("attention_impl='pallas'", activation, seqlen_alpha, mask, block_size)
  if block_size < _MIN_PALLAS_BLOCK or block_size & (block_size - 1):
    raise ValueError("attention_impl='pallas' needs a block_size that is a power of two >= "
                     f"{_MIN_PALLAS_BLOCK} (a GPU tile), got {block_size}.")
  return _blockwise_call(_pallas_attention, query, key, value, block_len=_pallas_block_len,
                         activation=activation, seqlen_alpha=seqlen_alpha,
                         block_size=block_size, dtype=dtype, precision=precision,
                         float32_scores=float32_scores)


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head self/cross attention with the activation family, qk-LN and an optional gate.

  Parameter names equal flax's `nn.MultiHeadDotProductAttention` (query, key, value, out, and
  query_ln/key_ln with qk-LN), so big_vision checkpoints load; with `gated=True` one more
  projection `gate` of the query input, shaped like the per-head output `[..., heads,
  head_dim]`, multiplies the attention output elementwise before `out` (the paper's gating
  ablation; bias on, activation `gate_activation`, 'none' by default as the paper names none).

  `impl` picks the implementation (ATTENTION_IMPLS): 'dense', or for a pointwise activation
  'chunked' (blocks of at most `block_size`), 'seq_parallel' (a ring over the mesh axis
  `seq_axis` of `mesh`; None: the context mesh) or 'pallas' (fused kernels, tiles of at most
  `block_size`). `block_size` None is the implementation's default (512 for chunked and
  seq_parallel, GPU tiles of 128 for pallas). The parameters are the same for all four.
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
  impl: str = "dense"
  block_size: int | None = None
  mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None
  seq_axis: str = "seq"

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array | None = None, *,
               mask: Array | None = None, sow_weights: bool = False) -> Array:
    """inputs_q `[batch, q_len, width]`, inputs_kv `[batch, k_len, width]` (default: inputs_q)
    -> `[batch, q_len, width]`."""
    validate_attention(self.activation, self.seqlen_alpha)
    validate_attention_impl(self.impl, self.activation)
    if sow_weights and self.impl != "dense":
      raise ValueError(f"sow_weights=True needs impl='dense': impl={self.impl!r} never "
                       "materialises the attention weights.")
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
    common = dict(activation=self.activation, seqlen_alpha=self.seqlen_alpha, mask=mask,
                  dtype=self.dtype, float32_scores=self.float32_scores)
    blocks = {} if self.block_size is None else dict(block_size=self.block_size)
    if self.impl == "dense":
      x = pointwise_attention(query, key, value, **common, module=self if sow_weights else None)
    elif self.impl == "chunked":
      x = chunked_pointwise_attention(query, key, value, **common, **blocks)
    elif self.impl == "pallas":
      x = pallas_pointwise_attention(query, key, value, **common, **blocks)
    else:
      x = seq_parallel_pointwise_attention(query, key, value, **common, **blocks, mesh=self.mesh,
                                           seq_axis=self.seq_axis)
    if self.gated:
      gate = dense(name="gate")(inputs_q)
      x = x * GATE_ACTIVATIONS[self.gate_activation](gate)
    return nn.DenseGeneral(features=width, axis=(-2, -1), kernel_init=self.kernel_init,
                           dtype=self.dtype, name="out")(x)
