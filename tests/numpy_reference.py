"""Independent float64 numpy re-implementations used as references by the tests.

Written from the definitions in the paper and big_vision's documented architecture, never from
the modules under test.
"""
import numpy as np
from scipy.special import erf

NUMPY_H = {
    "relu": lambda x: np.maximum(x, 0.0),
    "relu2": lambda x: np.maximum(x, 0.0) ** 2,
    "gelu": lambda x: 0.5 * x * (1.0 + erf(x / np.sqrt(2.0))),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "identity": lambda x: x,
    "relu6": lambda x: np.clip(x, 0.0, 6.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "zero": np.zeros_like,
}
# h' of each pointwise activation (relu's and relu6's kinks get 0, as in jax).
NUMPY_DH = {
    "relu": lambda x: (x > 0.0).astype(x.dtype),
    "relu2": lambda x: 2.0 * np.maximum(x, 0.0),
    "gelu": lambda x: (0.5 * (1.0 + erf(x / np.sqrt(2.0)))
                       + x * np.exp(-0.5 * x ** 2) / np.sqrt(2.0 * np.pi)),
    "softplus": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "identity": np.ones_like,
    "relu6": lambda x: ((x > 0.0) & (x < 6.0)).astype(x.dtype),
    "sigmoid": lambda x: np.exp(-x) / (1.0 + np.exp(-x)) ** 2,
    "zero": np.zeros_like,
}
NUMPY_GATE = {"none": lambda x: x, "silu": lambda x: x / (1.0 + np.exp(-x)),
              "sigmoid": NUMPY_H["sigmoid"]}


def attention(q, k, v, activation, alpha, mask=None):
  """q [b, q, h, d], k/v [b, k, h, d] -> (out [b, q, h, d], weights [b, h, q, k])."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  if activation == "softmax":
    if mask is not None:
      scores = np.where(mask, scores, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = e / e.sum(-1, keepdims=True)
  else:
    weights = k.shape[1] ** -alpha * NUMPY_H[activation](scores)
    if mask is not None:
      weights = np.where(mask, weights, 0.0)
  return np.einsum("bhqk,bkhd->bqhd", weights, v), weights


def attention_grads(q, k, v, d_out, activation, alpha):
  """(dq, dk, dv) of sum(attention(q, k, v)[0] * d_out) for a pointwise activation, by the
  chain rule through out = W v, W = k_len^-alpha h(S), S = q k^T / sqrt(d)."""
  q, k, v, d_out = (np.asarray(a, np.float64) for a in (q, k, v, d_out))
  root_d = np.sqrt(q.shape[-1])
  scores = np.einsum("bqhd,bkhd->bhqk", q, k) / root_d
  scale = k.shape[1] ** -alpha
  d_v = np.einsum("bhqk,bqhd->bkhd", scale * NUMPY_H[activation](scores), d_out)
  d_scores = np.einsum("bqhd,bkhd->bhqk", d_out, v) * scale * NUMPY_DH[activation](scores)
  d_q = np.einsum("bhqk,bkhd->bqhd", d_scores, k) / root_d
  d_k = np.einsum("bhqk,bqhd->bkhd", d_scores, q) / root_d
  return d_q, d_k, d_v


def layer_norm(x, scale, bias=None, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  y = (x - mean) / np.sqrt(var + eps) * scale
  return y if bias is None else y + bias


def gelu_tanh(x):
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def multihead(p, xq, xkv, *, activation="softmax", alpha=1.0, qk_norm=False, gated=False,
              gate_activation="none"):
  proj = lambda name, x: np.einsum("bld,dhk->blhk", x, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = proj("query", xq), proj("key", xkv), proj("value", xkv)
  if qk_norm:
    q, k = layer_norm(q, p["query_ln"]["scale"]), layer_norm(k, p["key_ln"]["scale"])
  o, _ = attention(q, k, v, activation, alpha)
  if gated:
    o = o * NUMPY_GATE[gate_activation](proj("gate", xq))
  return np.einsum("blhk,hkd->bld", o, p["out"]["kernel"]) + p["out"]["bias"]


def mlp(p, x):
  h = gelu_tanh(x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
  return h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]


def sincos2d(h, w, width, temperature=10_000.0):
  y, x = np.mgrid[:h, :w]
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4 - 1))
  x = np.outer(x.ravel(), omega)
  y = np.outer(y.ravel(), omega)
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)[None]


def vit(params, images, *, patch, depth, pool_type="gap", posemb="learn", rep_size=False,
        **attn_kw):
  """big_vision's ViT forward in float64, per-layer parameter layout. Returns logits."""
  p = params
  images = np.asarray(images, np.float64)
  n, hh, ww, c = images.shape
  gh, gw = hh // patch, ww // patch
  patches = images.reshape(n, gh, patch, gw, patch, c).transpose(0, 1, 3, 2, 4, 5)
  kernel = p["embedding"]["kernel"]  # [p, p, c, width]
  x = patches.reshape(n, gh * gw, patch * patch * c) @ kernel.reshape(-1, kernel.shape[-1])
  x = x + p["embedding"]["bias"]
  width = x.shape[-1]
  x = x + (p["pos_embedding"] if posemb == "learn" else sincos2d(gh, gw, width))
  if pool_type == "tok":
    x = np.concatenate([np.broadcast_to(p["cls"], (n, 1, width)), x], axis=1)
  for i in range(depth):
    b = p["Transformer"][f"encoderblock_{i}"]
    y = layer_norm(x, b["LayerNorm_0"]["scale"], b["LayerNorm_0"]["bias"])
    x = x + multihead(b["MultiHeadDotProductAttention_0"], y, y, **attn_kw)
    y = layer_norm(x, b["LayerNorm_1"]["scale"], b["LayerNorm_1"]["bias"])
    x = x + mlp(b["MlpBlock_0"], y)
  en = p["Transformer"]["encoder_norm"]
  x = layer_norm(x, en["scale"], en["bias"])
  if pool_type == "gap":
    x = x.mean(1)
  elif pool_type in ("0", "tok"):
    x = x[:, 0]
  elif pool_type == "map":
    m = p["MAPHead_0"]
    probe = np.broadcast_to(m["probe"], (n, 1, width))
    x = multihead(m["MultiHeadDotProductAttention_0"], probe, x)
    x = x + mlp(m["MlpBlock_0"], layer_norm(x, m["LayerNorm_0"]["scale"], m["LayerNorm_0"]["bias"]))
    x = x[:, 0]
  if rep_size:
    x = np.tanh(x @ p["pre_logits"]["kernel"] + p["pre_logits"]["bias"])
  return x @ p["head"]["kernel"] + p["head"]["bias"]
