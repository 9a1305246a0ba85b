"""ViT: big_vision's parameter tree, a float64 numpy forward, and .npz loading."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from big_vision_relu.models import attention as attn
from big_vision_relu.models import vit

import numpy_reference
from conftest import PRODUCTION_COMPILE

SMALL = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=(8, 8))
IMAGES = jax.random.normal(jax.random.PRNGKey(7), (2, 32, 32, 3))


def randomized_init(model, images=IMAGES, seed=0):
  """Init, then replace every leaf by random values (zero-init heads would hide bugs)."""
  params = model.init(jax.random.PRNGKey(seed), images)["params"]
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
  leaves = [0.3 * jax.random.normal(k, l.shape, l.dtype) + (1.0 if l.ndim == 1 else 0.0)
            for k, l in zip(keys, leaves)]
  return jax.tree.unflatten(tree, leaves)


def expected_shapes(variant, num_classes=1000, image=224, pool_type="gap", rep_size=False,
                    qk_norm=False, gated=False):
  """The parameter tree of big_vision's ViT, written from the documented layout."""
  name, patch = variant.split("/")
  width, depth, mlp, heads = vit.VARIANTS[name]
  p, d = int(patch), width // heads
  tokens = (image // p) ** 2
  shapes = {"embedding/kernel": (p, p, 3, width), "embedding/bias": (width,),
            "pos_embedding": (1, tokens, width),
            "Transformer/encoder_norm/scale": (width,), "Transformer/encoder_norm/bias": (width,),
            "head/kernel": (rep_size or width, num_classes), "head/bias": (num_classes,)}
  if pool_type == "tok":
    shapes["cls"] = (1, 1, width)
  if rep_size:
    shapes["pre_logits/kernel"] = (width, rep_size)
    shapes["pre_logits/bias"] = (rep_size,)

  def block(prefix):
    out = {f"{prefix}LayerNorm_0/scale": (width,), f"{prefix}LayerNorm_0/bias": (width,),
           f"{prefix}LayerNorm_1/scale": (width,), f"{prefix}LayerNorm_1/bias": (width,),
           f"{prefix}MlpBlock_0/Dense_0/kernel": (width, mlp),
           f"{prefix}MlpBlock_0/Dense_0/bias": (mlp,),
           f"{prefix}MlpBlock_0/Dense_1/kernel": (mlp, width),
           f"{prefix}MlpBlock_0/Dense_1/bias": (width,)}
    att = f"{prefix}MultiHeadDotProductAttention_0/"
    for proj in ("query", "key", "value") + (("gate",) if gated else ()):
      out[f"{att}{proj}/kernel"] = (width, heads, d)
      out[f"{att}{proj}/bias"] = (heads, d)
    out[f"{att}out/kernel"] = (heads, d, width)
    out[f"{att}out/bias"] = (width,)
    if qk_norm:
      out[f"{att}query_ln/scale"] = (d,)
      out[f"{att}key_ln/scale"] = (d,)
    return out

  for i in range(depth):
    shapes.update(block(f"Transformer/encoderblock_{i}/"))
  if pool_type == "map":
    head = block("MAPHead_0/")
    head = {k: v for k, v in head.items() if "LayerNorm_1" not in k}
    head["MAPHead_0/probe"] = (1, 1, width)
    shapes.update(head)
  return shapes


def abstract_shapes(model, image=224):
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          jax.ShapeDtypeStruct((1, image, image, 3), jnp.float32))["params"]
  return {k: v.shape for k, v in vit.flatten_params(params).items()}


@pytest.mark.parametrize("name", list(vit.VARIANTS))
def test_parameter_tree_of_every_variant(name):
  variant = f"{name}/16"
  assert abstract_shapes(vit.Model(1000, variant=variant)) == expected_shapes(variant)


@pytest.mark.parametrize("kw", [dict(pool_type="tok", rep_size=768),
                                dict(pool_type="map"),
                                dict(qk_norm=True, gated=True, attention="relu")])
def test_parameter_tree_options(kw):
  got = abstract_shapes(vit.Model(1000, variant="B/32", **kw))
  exp_kw = {k: v for k, v in kw.items() if k != "attention"}
  assert got == expected_shapes("B/32", **exp_kw)


def test_scan_layout_stacks_blocks():
  per_layer = abstract_shapes(vit.Model(10, variant="S/16"))
  scanned = abstract_shapes(vit.Model(10, variant="S/16", scan=True))
  for key, shape in per_layer.items():
    if key.startswith("Transformer/encoderblock_0/"):
      rest = key[len("Transformer/encoderblock_0/"):]
      assert scanned["Transformer/encoderblock/" + rest] == (12, *shape)
  assert not any(k.startswith("Transformer/encoderblock_") for k in scanned)


@pytest.mark.parametrize("kw", [
    dict(pool_type="gap"),
    dict(pool_type="tok", rep_size=16, posemb="sincos2d"),
    dict(pool_type="map"),
    dict(pool_type="0", rep_size=True),
    dict(attention="relu", qk_norm=True),
    dict(attention="relu2", seqlen_alpha=0.5, gated=True),
    dict(attention="sigmoid", seqlen_alpha=1.5, qk_norm=True, gated=True, gate_activation="silu"),
    dict(pool_type="map", attention="relu", qk_norm=True, gated=True, flatten_tokens=True),
])
def test_logits_equal_float64_numpy_forward(kw):
  model = vit.Model(5, **SMALL, **kw)
  params = randomized_init(model)
  logits, out = model.apply({"params": params}, IMAGES)
  np_params = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  attn_kw = dict(activation=kw.get("attention", "softmax"), alpha=kw.get("seqlen_alpha", 1.0),
                 qk_norm=kw.get("qk_norm", False), gated=kw.get("gated", False),
                 gate_activation=kw.get("gate_activation", "none"))
  expected = numpy_reference.vit(
      np_params, IMAGES, patch=8, depth=2, pool_type=kw["pool_type"] if "pool_type" in kw
      else "gap", posemb=kw.get("posemb", "learn"), rep_size=kw.get("rep_size", False), **attn_kw)
  np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
  assert out["logits"] is logits
  assert {"stem", "with_posemb", "encoder", "encoded", "head_input", "pre_logits",
          "pre_logits_2d", "logits", "logits_2d"} <= set(out)
  assert set(out["encoder"]) == {"block00", "block01", "pre_ln"}


@pytest.mark.parametrize("kw", [dict(attention="relu", qk_norm=True),
                                dict(pool_type="map", attention="relu2", gated=True)])
def test_flatten_tokens_changes_neither_parameters_nor_results(kw):
  """flatten_tokens=True (the Dense layers on [batch * len, ...]) is the same model: the same
  parameter tree and initial values, and bit-identical logits and gradients; but its Dense
  layers do run on the flat tokens."""
  images = IMAGES[:1].repeat(3, axis=0) + jnp.arange(3.0)[:, None, None, None]  # [3, 32, 32, 3]
  model, flat = vit.Model(5, **SMALL, **kw), vit.Model(5, **SMALL, **kw, flatten_tokens=True)
  forward = lambda m: lambda p: m.apply({"params": p}, images)[0]  # noqa: E731
  init = lambda m: m.init(jax.random.PRNGKey(0), images)["params"]  # noqa: E731
  jax.tree.map(np.testing.assert_array_equal, init(flat), init(model))
  params = randomized_init(model, images)

  def dot_operands(m):  # the operand types of every dot in the forward's StableHLO
    text = jax.jit(forward(m)).lower(params).as_text()
    return " ".join(line.rsplit(":", 1)[1] for line in text.splitlines() if "dot_general" in line)

  batch_len_features = r"tensor<3x16x\d+xf32>"  # [batch 3, len 16, features]: a Dense's input
  assert re.search(batch_len_features, dot_operands(model))
  assert not re.search(batch_len_features, dot_operands(flat))

  loss_and_grads = lambda m: jax.jit(jax.value_and_grad(  # noqa: E731
      lambda p: jnp.sum(jnp.sin(forward(m)(p)))), compiler_options=PRODUCTION_COMPILE)(params)
  (loss, grads), (flat_loss, flat_grads) = loss_and_grads(model), loss_and_grads(flat)
  assert flat_loss == loss
  jax.tree.map(np.testing.assert_array_equal, flat_grads, grads)


def test_dtype_mm_bfloat16_close_to_float32():
  params = randomized_init(vit.Model(5, **SMALL))
  f32, _ = vit.Model(5, **SMALL).apply({"params": params}, IMAGES)
  bf16, _ = vit.Model(5, **SMALL, dtype_mm="bfloat16").apply({"params": params}, IMAGES)
  assert not np.array_equal(f32, bf16)  # the matmuls really ran in bfloat16
  np.testing.assert_allclose(bf16.astype(np.float32), f32, rtol=0.1, atol=0.1 * np.abs(f32).max())


def test_npz_roundtrip_and_scan_per_layer_conversion(tmp_path):
  per_layer = vit.Model(5, **SMALL, attention="relu", qk_norm=True)
  scanned = vit.Model(5, **SMALL, attention="relu", qk_norm=True, scan=True)
  params = randomized_init(per_layer)
  logits, _ = per_layer.apply({"params": params}, IMAGES)
  path = str(tmp_path / "w.npz")
  vit.save_npz(params, path)
  assert set(np.load(path).files) == set(vit.flatten_params(params))

  loaded = vit.load(per_layer.init(jax.random.PRNGKey(9), IMAGES)["params"], path, {})
  np.testing.assert_array_equal(per_layer.apply({"params": loaded}, IMAGES)[0], logits)

  scan_params = vit.load(scanned.init(jax.random.PRNGKey(9), IMAGES)["params"], path, {})
  np.testing.assert_allclose(scanned.apply({"params": scan_params}, IMAGES)[0], logits,
                             rtol=1e-5, atol=1e-5)
  # And back: a scanned file into a per-layer model.
  scan_path = str(tmp_path / "scan.npz")
  vit.save_npz(scan_params, scan_path)
  back = vit.load(per_layer.init(jax.random.PRNGKey(9), IMAGES)["params"], scan_path, {})
  jax.tree.map(np.testing.assert_array_equal, back, params)
  # Without init params, the layout model_cfg asks for.
  raw = vit.load(None, scan_path, {"scan": False})
  jax.tree.map(np.testing.assert_array_equal, raw, jax.tree.map(np.asarray, params))


def test_posemb_resampled_to_a_new_grid(tmp_path):
  small = vit.Model(5, **SMALL)
  params = randomized_init(small)
  path = str(tmp_path / "w.npz")
  vit.save_npz(params, path)
  big_images = jnp.zeros((1, 48, 48, 3))
  big = vit.Model(5, **SMALL)
  loaded = vit.load(big.init(jax.random.PRNGKey(0), big_images)["params"], path, {})
  old = np.asarray(params["pos_embedding"]).reshape(4, 4, 32)
  expected = tf.image.resize(old, (6, 6), method="bilinear", antialias=False).numpy()
  np.testing.assert_allclose(loaded["pos_embedding"], expected.reshape(1, 36, 32), atol=1e-5)
  big.apply({"params": loaded}, big_images)  # and the model runs with it


def test_dont_load_and_strict_diff(tmp_path):
  params = randomized_init(vit.Model(5, **SMALL))
  path = str(tmp_path / "w.npz")
  vit.save_npz(params, path)
  # A new head (10 classes) and qk-LN scales the file does not have.
  target_model = vit.Model(10, **SMALL, qk_norm=True)
  init = target_model.init(jax.random.PRNGKey(3), IMAGES)["params"]
  with pytest.raises(ValueError) as error:
    vit.load(init, path, {})
  message = str(error.value)
  assert "- Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query_ln/scale" in message
  assert "head/kernel: file (32, 5) vs model (32, 10)" in message
  loaded = vit.load(init, path, {}, dont_load=["head/.*", ".*_ln/scale"])
  flat_loaded, flat_init, flat_file = map(vit.flatten_params, (loaded, init, params))
  for key, value in flat_loaded.items():
    source = flat_init if key.startswith("head/") or "_ln/" in key else flat_file
    np.testing.assert_array_equal(value, source[key])
  # Unexpected keys are reported too.
  with pytest.raises(ValueError, match=r"unexpected in the file[\s\S]*\+ head/bias"):
    vit.load(vit.Model(None, **SMALL).init(jax.random.PRNGKey(0), IMAGES)["params"], path, {})


@pytest.mark.parametrize("kw,match", [
    (dict(variant="Q/16"), "Unknown ViT variant 'Q/16'; valid names: mu, Ti, S"),
    (dict(variant="S/x"), "Bad patch size"),
    (dict(pool_type="avg"), "valid: gap, tok, map, 0, none"),
    (dict(posemb="rope"), "valid: learn, sincos2d"),
    (dict(attention_impl="flash"), "valid: dense"),
    (dict(attention="tanh"), "valid choices: softmax, relu"),
    (dict(gate_activation="silu"), "no effect without gated=True"),
    (dict(flatten_tokens=True, attention="relu", attention_impl="seq_parallel"),
     "set flatten_tokens=False with seq_parallel"),
])
def test_config_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    kw = {**dict(variant="mu/8"), **kw}
    vit.Model(3, **kw).init(jax.random.PRNGKey(0), IMAGES)


def test_attention_keywords_become_the_models_one_attention_options():
  """The flat keywords (config.model's) set the fields of one AttentionOptions, whose defaults
  are the only ones; a bad value fails when the model is built, before anything is traced."""
  model = vit.Model(3, variant="mu/8", attention="relu", seqlen_alpha=0.5, qk_norm=True,
                    attention_impl="chunked", attention_block_size=16)
  assert model.attention_options == attn.AttentionOptions(
      activation="relu", seqlen_alpha=0.5, qk_norm=True, impl="chunked", block_size=16)
  assert vit.Model(3, variant="mu/8").attention_options == attn.AttentionOptions()
  with pytest.raises(ValueError, match="seqlen_alpha must be a finite number >= 0"):
    vit.Model(3, variant="mu/8", attention="relu", seqlen_alpha=-1.0)
