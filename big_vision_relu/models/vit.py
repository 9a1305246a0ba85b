"""Vision Transformer with big_vision's parameter tree and a configurable attention family.

With `attention='softmax'`, `qk_norm=False`, `gated=False` the parameters and the function are
those of big_vision's ViT for the same options, so its released `.npz` checkpoints load
(`load`). Our options select the attention of the encoder blocks (`attention.AttentionOptions`,
which `Model` builds once from the flat keys, e.g. `attention='relu'`); the MAP head's pooling
attention stays softmax, as the paper only changes the encoder's attention.

    model = Model(num_classes=1000, variant="S/16", attention="relu", qk_norm=True)
    logits, out = model.apply({"params": params}, images, train=False)  # images [n, h, w, 3]
"""
from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from big_vision_relu.models import attention as attn
from big_vision_relu.models import multihead

Array = jax.Array

# name: (width, depth, mlp_dim, num_heads)
VARIANTS: dict[str, tuple[int, int, int, int]] = {
    "mu": (32, 1, 128, 2),
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "M": (512, 12, 2048, 8),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "So400m": (1152, 27, 4304, 16),
    "H": (1280, 32, 5120, 16),
    "g": (1408, 40, 6144, 16),
    "G": (1664, 48, 8192, 16),
    "e": (1792, 56, 15360, 16),
}
POOL_TYPES = ("gap", "tok", "map", "0", "none")
POSEMB_TYPES = ("learn", "sincos2d")


def decode_variant(variant: str) -> dict[str, Any]:
  """'S/16' -> {width, depth, mlp_dim, num_heads, patch_size=(16, 16)}; 'S' -> no patch."""
  name, _, patch = variant.partition("/")
  if name not in VARIANTS:
    raise ValueError(f"Unknown ViT variant {variant!r}; valid names: {', '.join(VARIANTS)} "
                     "(optionally '/patch', e.g. 'S/16').")
  width, depth, mlp_dim, num_heads = VARIANTS[name]
  out = dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads)
  if patch:
    if not patch.isdigit():
      raise ValueError(f"Bad patch size in variant {variant!r}: expected e.g. 'S/16'.")
    out["patch_size"] = (int(patch), int(patch))
  return out


def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.0,
                     dtype: Any = jnp.float32) -> Array:
  """Fixed 2d sin-cos position embedding `[1, h*w, width]`, MoCo-v3 layout [sin x, cos x,
  sin y, cos y]."""
  if width % 4:
    raise ValueError(f"sincos2d needs a width divisible by 4, got {width}.")
  y, x = jnp.mgrid[:h, :w]
  quarter = width // 4
  omega = 1.0 / temperature ** (jnp.arange(quarter) / (quarter - 1))
  y = y.reshape(-1)[:, None] * omega[None, :]
  x = x.reshape(-1)[:, None] * omega[None, :]
  pe = jnp.concatenate([jnp.sin(x), jnp.cos(x), jnp.sin(y), jnp.cos(y)], axis=1)
  return jnp.asarray(pe, dtype)[None]


class MlpBlock(nn.Module):
  """Dense -> tanh-GELU -> dropout -> Dense, with big_vision's initialisers; `flatten_tokens`:
  the Dense layers run on `[batch * len, ...]` (`multihead.on_flat_tokens`)."""
  mlp_dim: int
  dropout: float = 0.0
  dtype_mm: Any = jnp.float32
  flatten_tokens: bool = False

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    def dense(features: int, x: Array) -> Array:
      layer = nn.Dense(features, dtype=self.dtype_mm, kernel_init=nn.initializers.xavier_uniform(),
                       bias_init=nn.initializers.normal(stddev=1e-6))
      return multihead.on_flat_tokens(layer, x) if self.flatten_tokens else layer(x)

    width = x.shape[-1]
    x = nn.gelu(dense(self.mlp_dim, x))  # flax's default gelu is the tanh approximation.
    x = nn.Dropout(rate=self.dropout)(x, deterministic)
    return dense(width, x)


class Encoder1DBlock(nn.Module):
  """Pre-LN transformer block: x + attn(LN(x)), then x + mlp(LN(x)).

  Returns `(x, out)` where `out` holds `sa`, `+sa`, `mlp`, `+mlp` (the block's intermediates).
  """
  mlp_dim: int
  num_heads: int
  dropout: float = 0.0
  dtype_mm: Any = jnp.float32
  attention_options: attn.AttentionOptions = attn.AttentionOptions()
  sow_attention_weights: bool = False
  flatten_tokens: bool = False

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> tuple[Array, dict[str, Array]]:
    out = {}
    y = nn.LayerNorm()(x)
    y = out["sa"] = multihead.MultiHeadDotProductAttention(
        num_heads=self.num_heads, options=self.attention_options, dtype=self.dtype_mm,
        flatten_tokens=self.flatten_tokens)(y, sow_weights=self.sow_attention_weights)
    y = nn.Dropout(rate=self.dropout)(y, deterministic)
    x = out["+sa"] = x + y
    y = nn.LayerNorm()(x)
    y = out["mlp"] = MlpBlock(mlp_dim=self.mlp_dim, dropout=self.dropout,
                              dtype_mm=self.dtype_mm, flatten_tokens=self.flatten_tokens)(
                                  y, deterministic)
    y = nn.Dropout(rate=self.dropout)(y, deterministic)
    x = out["+mlp"] = x + y
    return x, out


class Encoder(nn.Module):
  """`depth` blocks (a python loop, or one `nn.scan` with a leading depth axis) + final LN."""
  depth: int
  mlp_dim: int
  num_heads: int
  dropout: float = 0.0
  scan: bool = False
  remat_policy: str = "nothing_saveable"
  dtype_mm: Any = jnp.float32
  attention_options: attn.AttentionOptions = attn.AttentionOptions()
  sow_attention_weights: bool = False
  flatten_tokens: bool = False

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> tuple[Array, dict[str, Any]]:
    out = {}
    block_kw = dict(mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout=self.dropout,
                    dtype_mm=self.dtype_mm, attention_options=self.attention_options,
                    sow_attention_weights=self.sow_attention_weights,
                    flatten_tokens=self.flatten_tokens)
    if self.scan:
      # Remat only applies with scan (as in big_vision): the per-layer loop keeps activations.
      block = nn.remat(Encoder1DBlock, prevent_cse=False, static_argnums=(2,),
                       policy=getattr(jax.checkpoint_policies, self.remat_policy, None))
      # Sown intermediates (e.g. attention weights) get the leading depth axis, as params do.
      x, scan_out = nn.scan(block, variable_axes={"params": 0, "intermediates": 0},
                            split_rngs={"params": True, "dropout": True},
                            in_axes=nn.broadcast, length=self.depth)(
                                name="encoderblock", **block_kw)(x, deterministic)
      for layer in range(self.depth):
        out[f"block{layer:02d}"] = jax.tree.map(lambda o, i=layer: o[i], scan_out)
    else:
      for layer in range(self.depth):
        x, out[f"block{layer:02d}"] = Encoder1DBlock(name=f"encoderblock_{layer}",
                                                     **block_kw)(x, deterministic)
    out["pre_ln"] = x
    return nn.LayerNorm(name="encoder_norm")(x), out


class MAPHead(nn.Module):
  """Multihead attention pooling with a learned probe (softmax attention)."""
  mlp_dim: int
  num_heads: int
  flatten_tokens: bool = False

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x `[n, len, width]` -> `[n, width]`."""
    n, _, width = x.shape
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, width), x.dtype)
    probe = jnp.tile(probe, [n, 1, 1])
    x = multihead.MultiHeadDotProductAttention(num_heads=self.num_heads,
                                               flatten_tokens=self.flatten_tokens)(probe, x)
    y = nn.LayerNorm()(x)
    x = x + MlpBlock(mlp_dim=self.mlp_dim, flatten_tokens=self.flatten_tokens)(y)
    return x[:, 0]


class _Model(nn.Module):
  """ViT; see `Model` for the options."""
  num_classes: int | None = None
  patch_size: Sequence[int] = (16, 16)
  width: int = 768
  depth: int = 12
  mlp_dim: int | None = None
  num_heads: int = 12
  posemb: str = "learn"
  rep_size: int | bool = False
  dropout: float = 0.0
  pool_type: str = "gap"
  head_zeroinit: bool = True
  scan: bool = False
  remat_policy: str = "nothing_saveable"
  dtype_mm: str = "float32"
  # Ours: the encoder's attention; `Model` builds it from the flat config keys.
  attention_options: attn.AttentionOptions = attn.AttentionOptions()
  # Sow each encoder block's attention weights `[n, heads, q, k]` into the `intermediates`
  # collection (apply with mutable=["intermediates"]); no parameters, no change to the output.
  sow_attention_weights: bool = False
  # Ours: every Dense of the encoder and MAP head runs on `[batch * len, ...]`: the same
  # parameters and maths, faster training steps on XLA:CPU (`multihead.on_flat_tokens`). Off by
  # default: on TPU merging a token axis whose length is no multiple of 8 into the batch needs a
  # relayout, and seq_parallel shards the token axis.
  flatten_tokens: bool = False

  def validate(self) -> None:
    """Raises ValueError for bad options (also called at the start of every call); the attention
    options validated themselves when they were built."""
    if self.pool_type not in POOL_TYPES:
      raise ValueError(f"Unknown pool_type {self.pool_type!r}; valid: {', '.join(POOL_TYPES)}.")
    if self.posemb not in POSEMB_TYPES:
      raise ValueError(f"Unknown posemb {self.posemb!r}; valid: {', '.join(POSEMB_TYPES)}.")
    if self.flatten_tokens and self.attention_options.impl == "seq_parallel":
      raise ValueError("flatten_tokens=True merges the token axis into the batch, which "
                       "attention_impl='seq_parallel' shards over the mesh: set "
                       "flatten_tokens=False with seq_parallel.")

  @nn.compact
  def __call__(self, image: Array, *, train: bool = False) -> tuple[Array, dict[str, Any]]:
    """image `[n, h, w, c]` -> (logits `[n, num_classes]` (or the representation), out)."""
    self.validate()
    out = {}
    dtype_mm = jnp.dtype(self.dtype_mm)
    x = out["stem"] = nn.Conv(self.width, tuple(self.patch_size), strides=tuple(self.patch_size),
                              padding="VALID", name="embedding", dtype=dtype_mm)(image)
    n, h, w, c = x.shape
    x = jnp.reshape(x, [n, h * w, c])
    # The position embedding is added before the class token is prepended.
    if self.posemb == "learn":
      x = x + self.param("pos_embedding", nn.initializers.normal(stddev=1 / np.sqrt(c)),
                         (1, h * w, c), x.dtype)
    else:
      x = x + posemb_sincos_2d(h, w, c, dtype=x.dtype)
    out["with_posemb"] = x
    if self.pool_type == "tok":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, c), x.dtype)
      x = jnp.concatenate([jnp.tile(cls, [n, 1, 1]), x], axis=1)
    x = nn.Dropout(rate=self.dropout)(x, not train)

    x, out["encoder"] = Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim or 4 * self.width, num_heads=self.num_heads,
        dropout=self.dropout, scan=self.scan, remat_policy=self.remat_policy, dtype_mm=dtype_mm,
        attention_options=self.attention_options,
        sow_attention_weights=self.sow_attention_weights, flatten_tokens=self.flatten_tokens,
        name="Transformer")(x, deterministic=not train)
    encoded = out["encoded"] = x

    if self.pool_type == "map":
      x = MAPHead(num_heads=self.num_heads, mlp_dim=self.mlp_dim or 4 * self.width,
                  flatten_tokens=self.flatten_tokens)(x)
    elif self.pool_type == "gap":
      x = jnp.mean(x, axis=1)
    elif self.pool_type in ("0", "tok"):
      x = x[:, 0]
      if self.pool_type == "tok":
        encoded = encoded[:, 1:]
    out["head_input"] = x
    # A per-patch view of the representation and logits (pool_type 'none' keeps all tokens).
    x_2d = jnp.reshape(encoded, [n, h, w, -1])

    if self.rep_size:
      rep_size = self.width if self.rep_size is True else self.rep_size
      pre_logits = nn.Dense(rep_size, name="pre_logits")
      x_2d = jnp.tanh(pre_logits(x_2d))
      x = jnp.tanh(pre_logits(x))
    out["pre_logits_2d"] = x_2d
    out["pre_logits"] = x

    if self.num_classes:
      kernel_init = nn.initializers.zeros if self.head_zeroinit else nn.initializers.lecun_normal()
      head = nn.Dense(self.num_classes, kernel_init=kernel_init, name="head")
      out["logits_2d"] = head(x_2d)
      x = out["logits"] = head(x)
    return x, out


def Model(num_classes: int | None = None, *, variant: str | None = None,  # noqa: N802
          **kw: Any) -> _Model:
  """The ViT factory (big_vision's contract): `variant` 'S/16' fills width/depth/mlp/heads/patch.

  Options (keywords): patch_size, width, depth, mlp_dim, num_heads, posemb (learn | sincos2d),
  rep_size, dropout, pool_type (gap | tok | map | 0 | none), head_zeroinit, scan, remat_policy,
  dtype_mm; ours: flatten_tokens (see `_Model`), attention (softmax | relu | relu2 | gelu |
  softplus | identity | relu6 | sigmoid), seqlen_alpha, qk_norm, gated, gate_activation (none |
  silu | sigmoid),
  attention_impl (dense | chunked | seq_parallel | pallas | cudnn; the blockwise three for
  pointwise attention only, cudnn for softmax on a GPU), attention_block_size (largest block of
  chunked, of seq_parallel's local blocks, and of pallas's tiles, a power of two; None: the
  implementation's default, 512 for chunked and seq_parallel, for pallas 128 on a GPU and 512
  on a TPU),
  mesh and seq_axis (seq_parallel splits the sequence over the mesh axis seq_axis, 'seq' by
  default; mesh is a Mesh or config.mesh-style axes such as [('data', 2), ('seq', 4)], None =
  the context mesh of jax.set_mesh), sow_attention_weights (inspection: see `_Model`; dense
  only). Explicit keywords override the variant's values. The attention keywords become the
  model's one `attention_options` (`attention.AttentionOptions`, validated here; its
  `CONFIG_KEYS` map each keyword to its field).
  """
  attention_kw = {key: kw.pop(key) for key in list(kw) if key in attn.CONFIG_KEYS}
  return _Model(num_classes=num_classes, **{**(decode_variant(variant) if variant else {}), **kw},
                attention_options=attn.AttentionOptions.from_config(attention_kw))


# ---------------------------------------------------------------- .npz checkpoints

_SCAN_BLOCK = "Transformer/encoderblock/"
_LAYER_BLOCK = re.compile(r"^Transformer/encoderblock_(\d+)/(.*)$")


def flatten_params(params: Mapping[str, Any]) -> dict[str, Any]:
  """Nested param dict -> {'a/b/kernel': leaf} (big_vision's .npz key layout)."""
  return traverse_util.flatten_dict(dict(params), sep="/")


def save_npz(params: Mapping[str, Any], path: str) -> None:
  """Writes params as a big_vision-layout `.npz` (keys '/'-joined; bfloat16 saved as float32,
  which numpy's format cannot hold)."""
  import tensorflow as tf  # gfile reads and writes local paths and gs:// alike.
  arrays = {}
  for key, value in flatten_params(params).items():
    value = np.asarray(jax.device_get(value))
    arrays[key] = value.astype(np.float32) if value.dtype == jnp.bfloat16 else value
  buffer = io.BytesIO()  # zipfile needs a seekable file; gfile writes are not.
  np.savez(buffer, **arrays)
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(buffer.getvalue())


def _read_npz(path: str) -> dict[str, np.ndarray]:
  import tensorflow as tf
  with tf.io.gfile.GFile(path, "rb") as f:
    buffer = io.BytesIO(f.read())
  with np.load(buffer, allow_pickle=False) as data:
    return {k: data[k] for k in data.files}


def _to_scan_layout(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Per-layer `encoderblock_{i}/...` keys -> one `encoderblock/...` with a leading depth axis."""
  layers: dict[str, dict[int, np.ndarray]] = {}
  out = {}
  for key, value in flat.items():
    match = _LAYER_BLOCK.match(key)
    if match:
      layers.setdefault(match.group(2), {})[int(match.group(1))] = value
    else:
      out[key] = value
  for rest, by_layer in layers.items():
    if sorted(by_layer) != list(range(len(by_layer))):
      raise ValueError(f"Checkpoint has a gap in its layers for {rest}: {sorted(by_layer)}.")
    out[_SCAN_BLOCK + rest] = np.stack([by_layer[i] for i in range(len(by_layer))])
  return out


def _to_layer_layout(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """One scanned `encoderblock/...` -> per-layer `encoderblock_{i}/...` keys."""
  out = {}
  for key, value in flat.items():
    if key.startswith(_SCAN_BLOCK):
      rest = key[len(_SCAN_BLOCK):]
      for layer in range(value.shape[0]):
        out[f"Transformer/encoderblock_{layer}/{rest}"] = value[layer]
    else:
      out[key] = value
  return out


def resample_posemb(posemb: np.ndarray, new_len: int) -> np.ndarray:
  """Bilinear resampling of a learned `[1, gh*gw, width]` grid to `[1, new_len, width]`.

  Both grids must be square (the usual ViT case); half-pixel centres, no antialiasing.
  """
  old_len, width = posemb.shape[1:]
  old_side, new_side = round(old_len ** 0.5), round(new_len ** 0.5)
  if old_side ** 2 != old_len or new_side ** 2 != new_len:
    raise ValueError(f"Cannot resample pos_embedding of {old_len} tokens to {new_len}: only "
                     "square grids are supported. Add 'pos_embedding' to dont_load instead.")
  grid = jnp.asarray(posemb[0].reshape(old_side, old_side, width), jnp.float32)
  grid = jax.image.resize(grid, (new_side, new_side, width), method="bilinear", antialias=False)
  return np.asarray(grid, posemb.dtype).reshape(1, new_len, width)


def load(init_params: Mapping[str, Any] | None, path: str,
         model_cfg: Mapping[str, Any] | None = None,
         dont_load: Sequence[str] = ()) -> dict[str, Any]:
  """Loads a big_vision-layout `.npz` into the structure of `init_params`.

  Args:
    init_params: the freshly initialised (or `jax.eval_shape`-abstract) params whose structure,
      shapes and dtypes the result takes. Keys matching a `dont_load` regex keep these values.
      None: return the file's params as they are, in the layout `model_cfg['scan']` asks for.
    path: local or gs:// `.npz` path.
    model_cfg: the model's config; only its `scan` is read, and only when init_params is None.
    dont_load: regexes (re.fullmatch on '/'-joined keys) of params not to load, e.g. 'head/.*'.
  Returns:
    Nested params. Strict: any missing or unexpected key (not covered by dont_load), or a shape
    mismatch other than a resampleable `pos_embedding`, raises ValueError with the full diff.
    Scanned <-> per-layer layouts are converted to match `init_params`.
  """
  flat = _read_npz(path)
  if init_params is None:
    scan = bool((model_cfg or {}).get("scan", False))
    flat = _to_scan_layout(flat) if scan else _to_layer_layout(flat)
    return traverse_util.unflatten_dict(flat, sep="/")

  target = flatten_params(init_params)
  target_scanned = any(k.startswith(_SCAN_BLOCK) for k in target)
  flat = _to_scan_layout(flat) if target_scanned else _to_layer_layout(flat)
  skip = lambda k: any(re.fullmatch(p, k) for p in dont_load)  # noqa: E731

  missing = sorted(k for k in target if k not in flat and not skip(k))
  unexpected = sorted(k for k in flat if k not in target and not skip(k))
  mismatched = []
  result = {}
  for key, init_value in target.items():
    if skip(key) or key in missing:
      result[key] = init_value
      continue
    value = flat[key]
    if value.shape != init_value.shape:
      if key.endswith("pos_embedding") and value.ndim == 3:
        value = resample_posemb(value, init_value.shape[1])
      else:
        mismatched.append(f"  {key}: file {value.shape} vs model {init_value.shape}")
        continue
    result[key] = jnp.asarray(value, dtype=init_value.dtype)
  if missing or unexpected or mismatched:
    lines = [f"{path} does not match the model's parameters:"]
    if missing:
      lines += ["missing in the file (add a dont_load regex to keep their init):"]
      lines += [f"  - {k}" for k in missing]
    if unexpected:
      lines += ["unexpected in the file (not in the model):"] + [f"  + {k}" for k in unexpected]
    if mismatched:
      lines += ["shape mismatches:"] + mismatched
    raise ValueError("\n".join(lines))
  return traverse_util.unflatten_dict(result, sep="/")
