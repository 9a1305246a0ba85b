"""The attention family of "Replacing softmax with ReLU in Vision Transformers".

For scores (logits) `s = q.k / sqrt(head_dim)`:

    softmax:    w = softmax(s) over keys (the baseline; ignores `seqlen_alpha`)
    pointwise:  w = key_len ** -seqlen_alpha * h(s),   h in ACTIVATIONS

The `key_len ** -seqlen_alpha` factor multiplies h's OUTPUT (for relu2, gelu, softplus, relu6 and
sigmoid that differs from scaling the scores). `key_len` is the number of keys each query attends
over: the size of the key-length axis, class token included. A mask does NOT change it: masked
keys get weight 0 but still count, because a per-row count of unmasked keys would be a row
normalisation, which is exactly what the pointwise family does without.

This module holds the family (`pointwise_weights` is its single definition), the options of an
attention (`AttentionOptions`, validated once), the scores and weighted sum that every path
shares, and the dense path. Four implementations compute one function, each
given the one validated `AttentionOptions` (config -> options -> implementation):
  dense         `dense_attention` (here): the `[batch, heads, q_len, k_len]` weights are
                materialised; softmax or pointwise.
  chunked       `blockwise.chunked_pointwise_attention`: query x key blocks, memory O(len x block).
  seq_parallel  `blockwise.seq_parallel_pointwise_attention`: a ring over a mesh axis.
  pallas        `pallas_attention.pallas_pointwise_attention`: fused Pallas kernels (Mosaic on a
                TPU, Triton on a GPU).
And softmax's fastest GPU baseline, cuDNN's flash attention (`cudnn_attention`, impl 'cudnn').
The flax layer that picks one of them is `multihead.MultiHeadDotProductAttention`;
`dot_product_attention` is the dense path as a keyword-argument flax `attention_fn`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from big_vision_relu import sharding

Array = jax.Array
Mesh = jax.sharding.Mesh | jax.sharding.AbstractMesh

# h of the pointwise family. gelu is the exact erf form, as in the paper's family.
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": jax.nn.relu,
    "relu2": lambda x: jnp.square(jax.nn.relu(x)),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "softplus": jax.nn.softplus,
    "identity": lambda x: x,
    "relu6": jax.nn.relu6,
    "sigmoid": jax.nn.sigmoid,
    # Attention off: every weight 0, so tokens never mix (the block adds only out's bias). The
    # control that says how much of a large alpha's result is attention at all.
    "zero": jnp.zeros_like,
}
# The paper's family (its Figure 2): all of ACTIVATIONS but the attention-off control.
PAPER_ACTIVATIONS: tuple[str, ...] = tuple(a for a in ACTIVATIONS if a != "zero")
ATTENTION_NAMES: tuple[str, ...] = ("softmax", *ACTIVATIONS)
ATTENTION_IMPLS: tuple[str, ...] = ("dense", "chunked", "seq_parallel", "pallas", "cudnn")
BLOCKWISE_IMPLS: tuple[str, ...] = ("chunked", "seq_parallel", "pallas")  # pointwise only
GATE_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "none": lambda x: x,
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
}
MIN_PALLAS_BLOCK = 16  # the smallest tile of a GPU matrix multiply (Triton's tl.dot)

# The flat keys of `vit.Model` (and `config.model`) that are attention options -> the field of
# `AttentionOptions` each one sets.
CONFIG_KEYS: dict[str, str] = {
    "attention": "activation",
    "seqlen_alpha": "seqlen_alpha",
    "qk_norm": "qk_norm",
    "gated": "gated",
    "gate_activation": "gate_activation",
    "attention_impl": "impl",
    "attention_block_size": "block_size",
    "mesh": "mesh",
    "seq_axis": "seq_axis",
}


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
  """What an attention layer computes and how; validated when built (ValueError naming the valid
  values), so a bad config fails before anything is traced.

  Attributes:
    activation: one of ATTENTION_NAMES (config key `attention`).
    seqlen_alpha: exponent of `key_len ** -seqlen_alpha`, a finite number >= 0 (ignored by
      softmax).
    qk_norm: per-head LayerNorm of queries and keys (flax's `normalize_qk`).
    gated: multiply the attention output by a projection of the input before `out` (the paper's
      gating ablation); self-attention only.
    gate_activation: one of GATE_ACTIVATIONS, applied to the gate ('none' needs no `gated`).
    impl: one of ATTENTION_IMPLS (config key `attention_impl`); the blockwise three need a
      pointwise activation, cudnn (cuDNN's flash attention, a GPU only) softmax.
    block_size: largest block of chunked, of seq_parallel's local blocks and of pallas's tiles
      (a power of two >= 16 for pallas; on a TPU its tiles are multiples of 128); None: the
      implementation's default (config key `attention_block_size`).
    mesh: the device mesh of seq_parallel; None: the context mesh (`jax.set_mesh`) at trace time.
    seq_axis: the mesh axis seq_parallel splits the sequence over.
    float32_scores: compute scores and weights in float32 even for bfloat16 inputs.
    precision: matmul precision (`jax.lax.Precision`), None: the platform's default.
  """
  activation: str = "softmax"
  seqlen_alpha: float = 1.0
  qk_norm: bool = False
  gated: bool = False
  gate_activation: str = "none"
  impl: str = "dense"
  block_size: int | None = None
  mesh: Mesh | None = None
  seq_axis: str = "seq"
  float32_scores: bool = True
  precision: Any = None

  def __post_init__(self) -> None:
    if self.activation not in ATTENTION_NAMES:
      raise ValueError(f"Unknown attention activation {self.activation!r}; valid choices: "
                       f"{', '.join(ATTENTION_NAMES)}.")
    alpha = self.seqlen_alpha
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
      raise ValueError("seqlen_alpha must be a finite number >= 0 (the exponent of "
                       f"key_len ** -alpha), got {alpha!r}.")
    if self.gate_activation not in GATE_ACTIVATIONS:
      raise ValueError(f"Unknown gate_activation {self.gate_activation!r}; valid choices: "
                       f"{', '.join(GATE_ACTIVATIONS)}.")
    if self.gate_activation != "none" and not self.gated:
      raise ValueError(f"gate_activation={self.gate_activation!r} has no effect without "
                       "gated=True; set gated=True or drop gate_activation.")
    if self.impl not in ATTENTION_IMPLS:
      raise ValueError(f"Unknown attention_impl {self.impl!r}; valid: "
                       f"{', '.join(ATTENTION_IMPLS)}.")
    combinations = ("Valid combinations: attention_impl='dense' with any attention; 'chunked', "
                    "'seq_parallel' and 'pallas' with the pointwise ones; 'cudnn' with softmax.")
    if self.impl in BLOCKWISE_IMPLS and self.activation == "softmax":
      raise ValueError(
          f"attention_impl={self.impl!r} needs a pointwise attention ({', '.join(ACTIVATIONS)}):"
          " softmax's row max and denominator span all keys, so its key blocks cannot simply be "
          f"added. {combinations}")
    if self.impl == "cudnn" and self.activation != "softmax":
      raise ValueError(f"attention_impl='cudnn' is cuDNN's softmax flash attention, not "
                       f"attention={self.activation!r}. {combinations}")
    block = self.block_size
    if block is not None and not (isinstance(block, int) and block >= 1):
      raise ValueError(f"block_size must be a positive int, got {block!r}.")
    if self.impl == "pallas" and block is not None and (block < MIN_PALLAS_BLOCK
                                                        or block & (block - 1)):
      raise ValueError("attention_impl='pallas' needs a block_size that is a power of two >= "
                       f"{MIN_PALLAS_BLOCK} (a GPU tile; a TPU's tiles are multiples of 128 of "
                       f"at most max(block_size, 128) rows), got {block}.")
    if self.mesh is not None and self.seq_axis not in self.mesh.axis_names:
      raise ValueError(
          f"The mesh has no sequence axis seq_axis={self.seq_axis!r} (axes: "
          f"{', '.join(self.mesh.axis_names) or 'none'}); attention_impl='seq_parallel' splits "
          "the sequence over it. Pass a mesh with that axis (e.g. mesh=[('data', 2), ('seq', "
          "4)]) or run under jax.set_mesh(mesh).")

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> AttentionOptions:
    """The options among the flat keys `config` holds (`CONFIG_KEYS`, as `vit.Model` and
    `config.model` name them); other keys are ignored, missing ones keep the defaults. A `mesh`
    given as config.mesh-style axes, e.g. [('data', 2), ('seq', 4)], is built over all devices
    (`sharding.make_mesh`, so it equals the trainer's mesh for the same axes)."""
    kw = {field: config[key] for key, field in CONFIG_KEYS.items() if key in config}
    mesh = kw.get("mesh")
    if mesh is not None and not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
      kw["mesh"] = sharding.make_mesh(mesh)
    return cls(**kw)

  def require_impl(self, impl: str) -> None:
    """Raises ValueError unless these options are for `impl` (validated for it when built)."""
    if self.impl != impl:
      raise ValueError(f"The {impl} implementation needs AttentionOptions(impl={impl!r}, ...), "
                       f"got impl={self.impl!r}.")


def seqlen_scale(key_len: int, seqlen_alpha: float) -> float:
  """`key_len ** -seqlen_alpha`, the constant factor of every pointwise weight."""
  return float(key_len) ** -float(seqlen_alpha)


def pointwise_weights(scores: Array, *, activation: str, seqlen_alpha: float,
                      key_len: int) -> Array:
  """`key_len ** -seqlen_alpha * h(scores)`: the one definition of the pointwise family (fused
  kernels apply the constant `seqlen_scale` to their sums instead of to every weight).

  Args:
    scores: already scaled by 1/sqrt(head_dim), any shape; for blockwise paths a block of the
      full score matrix.
    activation: a key of ACTIVATIONS (not softmax: it is not pointwise).
    seqlen_alpha: exponent of the sequence-length scale.
    key_len: the GLOBAL number of keys each query attends over (not a block's size).
  Returns:
    Weights with the shape and dtype of `scores`.
  """
  scale = seqlen_scale(key_len, seqlen_alpha)
  return ACTIVATIONS[activation](scores) * jnp.asarray(scale, scores.dtype)


class Layout(NamedTuple):
  """einsum subscripts of the scores and of the weighted sum."""
  logits: str
  weighted_sum: str


# `[batch..., len, heads, d]` arrays; and one head's `[len, d]` tiles (inside a Pallas kernel,
# whose GPU lowering takes 2-D dots only).
MULTI_HEAD = Layout("...qhd,...khd->...hqk", "...hqk,...khd->...qhd")
ONE_HEAD = Layout("qd,kd->qk", "qk,kd->qd")


def scaled_query(query: Array, head_dim: int | None = None) -> Array:
  """q / sqrt(head_dim) in q's dtype, computed in float32 and rounded back: the same bits as a
  bf16 division (float32 has over twice bf16's precision, so the double rounding is exact), and
  the form a Pallas GPU kernel lowers (Triton divides no bf16). `head_dim`: the true head dim
  where q's last axis is wider (a Pallas GPU tile, padded to a power of two); default q's."""
  wide = jnp.promote_types(query.dtype, jnp.float32)
  root = jnp.sqrt(head_dim or query.shape[-1]).astype(query.dtype)
  return (query.astype(wide) / root).astype(query.dtype)


def attention_logits(query: Array, key: Array, *, float32_scores: bool = True,
                     precision: Any = None, layout: Layout = MULTI_HEAD) -> Array:
  """The scores `q.k / sqrt(head_dim)` exactly as every attention path computes them.

  Args:
    query: `[batch..., q_len, heads, head_dim]` (`ONE_HEAD`: `[q_len, head_dim]`).
    key: `[batch..., k_len, heads, head_dim]` (`ONE_HEAD`: `[k_len, head_dim]`).
    float32_scores: at least float32 (bfloat16 is upcast, float64 stays float64).
    precision: matmul precision.
    layout: `MULTI_HEAD`, or `ONE_HEAD` for one head's tiles.
  Returns:
    `[batch..., heads, q_len, k_len]` (`ONE_HEAD`: `[q_len, k_len]`).
  """
  compute_dtype = jnp.result_type(query, key)
  if float32_scores:
    compute_dtype = jnp.promote_types(compute_dtype, jnp.float32)
  return jnp.einsum(layout.logits, scaled_query(query), key, precision=precision,
                    preferred_element_type=compute_dtype)


def weighted_sum(weights: Array, value: Array, *, precision: Any = None,
                 layout: Layout = MULTI_HEAD) -> Array:
  """Weights `[..., heads, q, k]` x value `[..., k, heads, d]` -> `[..., q, heads, d]`
  (`ONE_HEAD`: `[q, k]` x `[k, d]` -> `[q, d]`).

  The product runs in value's dtype (bf16 on TPU) and accumulates in float32 when the weights
  were kept in float32; the result keeps that accumulation dtype.
  """
  return jnp.einsum(layout.weighted_sum, weights.astype(value.dtype), value, precision=precision,
                    preferred_element_type=jnp.promote_types(weights.dtype, value.dtype))


def dense_weights(options: AttentionOptions, query: Array, key: Array,
                  mask: Array | None = None) -> Array:
  """Attention weights `[batch..., heads, q_len, k_len]` of `options` (its activation,
  seqlen_alpha, float32_scores and precision), masked entries exactly 0.

  Args:
    options: the attention's validated options.
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., k_len, heads, head_dim]`.
    mask: boolean, broadcastable to `[batch..., heads, q_len, k_len]`; False = not attended.
  """
  scores = attention_logits(query, key, float32_scores=options.float32_scores,
                            precision=options.precision)
  if options.activation == "softmax":
    if mask is not None:
      scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    return jax.nn.softmax(scores, axis=-1)
  weights = pointwise_weights(scores, activation=options.activation,
                              seqlen_alpha=options.seqlen_alpha, key_len=key.shape[-3])
  # Zero AFTER the activation: adding -inf first would give NaN for gelu/identity/softplus.
  return weights if mask is None else jnp.where(mask, weights, 0.0)


def dense_attention(options: AttentionOptions, query: Array, key: Array, value: Array, *,
                    mask: Array | None = None, dtype: Any = None,
                    module: nn.Module | None = None, dropout_rng: Array | None = None,
                    dropout_rate: float = 0.0, broadcast_dropout: bool = True,
                    deterministic: bool = True) -> Array:
  """The dense implementation: weights materialised, softmax or pointwise (`options`).

  Args:
    options: the attention's validated options (impl and block options play no part).
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., k_len, heads, head_dim]`.
    value: `[batch..., k_len, heads, v_dim]`.
    mask: boolean, broadcastable to `[batch..., heads, q_len, k_len]`; False = not attended.
    dtype: output dtype (default: the inputs' dtype).
    module: when given (flax passes its module with `sow_weights=True`), the weights are sown
      into its `intermediates/attention_weights`.
    dropout_rng, dropout_rate, broadcast_dropout, deterministic: attention-weight dropout, as
      in flax (`broadcast_dropout` shares the mask over the batch and head dimensions).
  Returns:
    `[batch..., q_len, heads, v_dim]`.
  """
  weights = dense_weights(options, query, key, mask)
  if module is not None:
    module.sow("intermediates", "attention_weights", weights)
  if not deterministic and dropout_rate > 0.0:
    keep_prob = 1.0 - dropout_rate
    shape = ((1,) * (weights.ndim - 2) + weights.shape[-2:] if broadcast_dropout
             else weights.shape)
    keep = jax.random.bernoulli(dropout_rng, keep_prob, shape)
    weights = weights * (keep / keep_prob).astype(weights.dtype)
  return weighted_sum(weights, value, precision=options.precision).astype(dtype or value.dtype)


def attention_weights(query: Array, key: Array, *, activation: str, seqlen_alpha: float = 1.0,
                      mask: Array | None = None, float32_scores: bool = True,
                      precision: Any = None) -> Array:
  """`dense_weights` with the options as keywords: `[batch..., heads, q_len, k_len]`, masked
  entries exactly 0 (query `[batch..., q_len, heads, head_dim]`, key `[batch..., k_len, heads,
  head_dim]`; activation one of ATTENTION_NAMES; mask broadcastable to the weights, False = not
  attended)."""
  options = AttentionOptions(activation=activation, seqlen_alpha=seqlen_alpha,
                             float32_scores=float32_scores, precision=precision)
  return dense_weights(options, query, key, mask)


def dot_product_attention(query: Array, key: Array, value: Array, *, activation: str = "relu",
                          seqlen_alpha: float = 1.0, mask: Array | None = None,
                          dropout_rng: Array | None = None, dropout_rate: float = 0.0,
                          broadcast_dropout: bool = True, deterministic: bool = True,
                          dtype: Any = None, precision: Any = None, float32_scores: bool = True,
                          module: nn.Module | None = None) -> Array:
  """Dense attention with softmax or pointwise weights (any of ATTENTION_NAMES); a drop-in flax
  `attention_fn`, whose keywords become one `AttentionOptions` for `dense_attention`.
  `pointwise_attention` is the same function.

  Args:
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., k_len, heads, head_dim]`.
    value: `[batch..., k_len, heads, v_dim]`.
    activation: one of ATTENTION_NAMES.
    seqlen_alpha: pointwise weights are `k_len ** -seqlen_alpha * h(q.k / sqrt(head_dim))`.
    mask, dropout_rng, dropout_rate, broadcast_dropout, deterministic, dtype, module: as in
      `dense_attention`.
    precision: matmul precision.
    float32_scores: compute scores and weights in float32 even when inputs are bfloat16.
  Returns:
    `[batch..., q_len, heads, v_dim]`.
  """
  options = AttentionOptions(activation=activation, seqlen_alpha=seqlen_alpha,
                             float32_scores=float32_scores, precision=precision)
  return dense_attention(options, query, key, value, mask=mask, dtype=dtype, module=module,
                         dropout_rng=dropout_rng, dropout_rate=dropout_rate,
                         broadcast_dropout=broadcast_dropout, deterministic=deterministic)


# The name of the paper's pointwise family, kept for callers (and flax configs) that use it.
pointwise_attention = dot_product_attention
