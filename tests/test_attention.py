"""The attention family against flax and an independent float64 numpy reference."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from big_vision_relu.models import attention as attn
from big_vision_relu.models.attention import AttentionOptions
from big_vision_relu.models.multihead import MultiHeadDotProductAttention

import numpy_reference

POINTWISE = ("relu", "relu2", "gelu", "softplus", "identity", "relu6", "sigmoid", "zero")
NUMPY_H = numpy_reference.NUMPY_H
numpy_attention = numpy_reference.attention


def qkv(seed=0, b=2, lq=7, lk=9, h=3, d=8, dtype=jnp.float32, scale=1.0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return tuple(scale * jax.random.normal(kk, (b, l, h, d), dtype)
               for kk, l in zip(ks, (lq, lk, lk)))


def test_softmax_equals_flax_dot_product_attention():
  q, k, v = qkv()
  mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.7, (2, 1, 7, 9)).at[..., 0].set(True)
  for m in (None, mask):
    ours = attn.dot_product_attention(q, k, v, activation="softmax", mask=m)
    ref = nn.dot_product_attention(q, k, v, mask=m)
    np.testing.assert_allclose(ours, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("normalize_qk", [False, True])
def test_module_equals_flax_multihead_attention(normalize_qk):
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 10, 24))
  ref_mod = nn.MultiHeadDotProductAttention(num_heads=3, normalize_qk=normalize_qk)
  params = ref_mod.init(jax.random.PRNGKey(2), x)["params"]
  # Non-trivial LayerNorm scales, so qk-LN is really exercised.
  params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(4), p.shape),
                        params)
  ours_mod = MultiHeadDotProductAttention(num_heads=3,
                                         options=AttentionOptions(qk_norm=normalize_qk))
  ours_params = ours_mod.init(jax.random.PRNGKey(2), x)["params"]
  assert jax.tree.map(jnp.shape, ours_params) == jax.tree.map(jnp.shape, params)
  np.testing.assert_allclose(ours_mod.apply({"params": params}, x),
                             ref_mod.apply({"params": params}, x), atol=1e-6, rtol=0)
  # And as a flax attention_fn inside flax's own module, for a pointwise activation.
  fn = functools.partial(attn.pointwise_attention, activation="relu2", seqlen_alpha=0.5)
  relu_ref = nn.MultiHeadDotProductAttention(num_heads=3, normalize_qk=normalize_qk,
                                             attention_fn=fn)
  relu_ours = MultiHeadDotProductAttention(num_heads=3, options=AttentionOptions(
      qk_norm=normalize_qk, activation="relu2", seqlen_alpha=0.5))
  np.testing.assert_allclose(relu_ours.apply({"params": params}, x),
                             relu_ref.apply({"params": params}, x), atol=1e-6, rtol=0)


@pytest.mark.parametrize("activation", POINTWISE + ("softmax",))
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0])
def test_every_activation_and_alpha_matches_numpy(activation, alpha):
  q, k, v = qkv(scale=1.5)
  out = attn.dot_product_attention(q, k, v, activation=activation, seqlen_alpha=alpha)
  weights = attn.attention_weights(q, k, activation=activation, seqlen_alpha=alpha)
  ref_out, ref_w = numpy_attention(q, k, v, activation, alpha)
  assert weights.shape == (2, 3, 7, 9)  # [batch, heads, q_len, k_len]
  np.testing.assert_allclose(weights, ref_w, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("activation", ["relu2", "sigmoid", "gelu", "softplus", "relu6"])
def test_scale_multiplies_the_output_of_h(activation):
  """Scaling the scores instead of h's output gives clearly different weights."""
  q, k, _ = qkv(scale=2.0)
  weights = attn.attention_weights(q, k, activation=activation, seqlen_alpha=1.0)
  scores = np.einsum("bqhd,bkhd->bhqk", np.float64(q), np.float64(k)) / np.sqrt(8)
  inside = NUMPY_H[activation](scores / 9)
  outside = NUMPY_H[activation](scores) / 9
  assert np.abs(outside - inside).max() > 1e-2
  np.testing.assert_allclose(weights, outside, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("activation", POINTWISE + ("softmax",))
def test_masks_zero_weights_after_the_activation(activation):
  q, k, v = qkv(seed=5)
  mask = np.array(jax.random.bernoulli(jax.random.PRNGKey(6), 0.6, (2, 3, 7, 9)))
  mask[..., 0] = True  # every query attends to something (softmax needs it)
  out = attn.dot_product_attention(q, k, v, activation=activation, seqlen_alpha=1.0, mask=mask)
  weights = attn.attention_weights(q, k, activation=activation, seqlen_alpha=1.0, mask=mask)
  # The reference scales by the full key axis (9 keys), masked keys included.
  ref_out, ref_w = numpy_attention(q, k, v, activation, 1.0, mask)
  assert np.all(np.isfinite(out))
  assert np.all(np.asarray(weights)[~mask] == 0.0)
  np.testing.assert_allclose(weights, ref_w, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("activation", POINTWISE + ("softmax",))
def test_gradients_match_finite_differences_away_from_the_kink(activation):
  with jax.enable_x64(True):
    q, k, v = qkv(seed=11, b=1, lq=4, lk=5, h=2, d=4, dtype=jnp.float64)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0
    # The perturbation of check_grads moves scores by ~1e-3; keep clear of relu's kink at 0 and
    # relu6's at 6.
    assert np.abs(scores).min() > 0.02 and np.abs(scores - 6).min() > 0.02
    fn = functools.partial(attn.dot_product_attention, activation=activation, seqlen_alpha=1.0)
    check_grads(fn, (q, k, v), order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("activation", POINTWISE)
def test_gradients_are_finite_at_the_kink(activation):
  # Orthogonal queries and keys: every score is exactly 0.
  q = jnp.zeros((1, 2, 1, 4)).at[0, :, 0, 0].set(1.0)
  k = jnp.zeros((1, 3, 1, 4)).at[0, :, 0, 1].set(1.0)
  v = jnp.ones((1, 3, 1, 4))
  loss = lambda q, k, v: attn.dot_product_attention(  # noqa: E731
      q, k, v, activation=activation).sum()
  grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  assert all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("activation", POINTWISE + ("softmax",))
def test_bfloat16_error_at_most_twice_a_naive_bfloat16(activation):
  q, k, v = qkv(seed=2, b=4, lq=64, lk=64, h=4, d=32, scale=1.5)
  ref = attn.dot_product_attention(q, k, v, activation=activation, seqlen_alpha=1.0)
  bf = [a.astype(jnp.bfloat16) for a in (q, k, v)]
  ours = attn.dot_product_attention(*bf, activation=activation, seqlen_alpha=1.0)
  naive = attn.dot_product_attention(*bf, activation=activation, seqlen_alpha=1.0,
                                   float32_scores=False)
  assert ours.dtype == jnp.bfloat16
  err = lambda o: float(jnp.abs(o.astype(jnp.float32) - ref).max())  # noqa: E731
  assert err(ours) <= 2 * err(naive), (err(ours), err(naive))


def test_gated_attention_multiplies_a_projection_before_out():
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 6, 16))
  for gate_activation, g in (("none", lambda z: z), ("silu", jax.nn.silu),
                             ("sigmoid", jax.nn.sigmoid)):
    mod = MultiHeadDotProductAttention(num_heads=2, options=AttentionOptions(
        activation="relu", gated=True, gate_activation=gate_activation))
    params = mod.init(jax.random.PRNGKey(0), x)["params"]
    params = jax.tree.map(lambda p: p + 0.1, params)  # non-zero gate bias
    assert params["gate"]["kernel"].shape == (16, 2, 8) and params["gate"]["bias"].shape == (2, 8)
    p = params
    proj = lambda name: jnp.einsum("bld,dhk->blhk", x, p[name]["kernel"]) + p[name]["bias"]  # noqa
    o = attn.dot_product_attention(proj("query"), proj("key"), proj("value"), activation="relu")
    o = o * g(proj("gate"))
    expected = jnp.einsum("blhk,hkd->bld", o, p["out"]["kernel"]) + p["out"]["bias"]
    np.testing.assert_allclose(mod.apply({"params": params}, x), expected, atol=1e-5, rtol=1e-5)


def test_sow_weights_through_flax_module_argument():
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 8))
  mod = MultiHeadDotProductAttention(num_heads=2, options=AttentionOptions(activation="relu"))
  params = mod.init(jax.random.PRNGKey(0), x)["params"]
  _, state = mod.apply({"params": params}, x, sow_weights=True, mutable=["intermediates"])
  (weights,) = state["intermediates"]["attention_weights"]
  assert weights.shape == (2, 2, 5, 5)
  assert float((weights == 0).mean()) > 0.1  # relu attention is sparse


@pytest.mark.parametrize("kwargs,match", [
    (dict(activation="relu3"), "valid choices: softmax, relu, relu2, gelu"),
    (dict(activation="relu", seqlen_alpha=-1.0), "finite number >= 0"),
    (dict(activation="relu", seqlen_alpha=float("nan")), "finite number >= 0"),
    (dict(activation="relu", seqlen_alpha=float("inf")), "finite number >= 0"),
])
def test_bad_arguments_raise(kwargs, match):
  q, k, v = qkv()
  with pytest.raises(ValueError, match=match):
    attn.dot_product_attention(q, k, v, **kwargs)


def test_bad_module_configs_raise():
  x = jnp.ones((1, 4, 8))
  with pytest.raises(ValueError, match="gate_activation.*valid choices: none, silu, sigmoid"):
    MultiHeadDotProductAttention(
        num_heads=2, options=AttentionOptions(gated=True, gate_activation="tanh")).init(
            jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="gated=True needs self-attention"):
    MultiHeadDotProductAttention(num_heads=2, options=AttentionOptions(gated=True)).init(
        jax.random.PRNGKey(0), x, jnp.ones((1, 3, 8)))


def test_pointwise_attention_is_an_alias_of_dot_product_attention():
  assert attn.dot_product_attention is attn.dot_product_attention


def test_attention_logits_are_the_scores_the_weights_come_from():
  q, k, _ = qkv(scale=1.5)
  logits = attn.attention_logits(q, k)
  ref = np.einsum("bqhd,bkhd->bhqk", np.float64(q), np.float64(k)) / np.sqrt(8)
  assert logits.shape == (2, 3, 7, 9)  # [batch, heads, q_len, k_len]
  np.testing.assert_allclose(logits, ref, rtol=2e-5, atol=2e-6)
  # identity with alpha 0 is exactly the scores: the dense path uses these very logits.
  np.testing.assert_array_equal(
      attn.attention_weights(q, k, activation="identity", seqlen_alpha=0.0), logits)
  np.testing.assert_array_equal(attn.attention_weights(q, k, activation="softmax"),
                                jax.nn.softmax(logits, axis=-1))


@pytest.mark.parametrize("kwargs,match", [
    (dict(activation="tanh"), "valid choices: softmax, relu, relu2, gelu, softplus, identity"),
    (dict(seqlen_alpha=-0.5), "finite number >= 0"),
    (dict(impl="flash"), "valid: dense, chunked, seq_parallel, pallas"),
    (dict(impl="chunked"), "'chunked', 'seq_parallel' and 'pallas' with the pointwise ones"),
    (dict(gated=True, gate_activation="tanh"), "valid choices: none, silu, sigmoid"),
    (dict(gate_activation="silu"), "no effect without gated=True"),
    (dict(activation="relu", impl="chunked", block_size=0), "block_size must be a positive int"),
    (dict(activation="relu", impl="pallas", block_size=48), "a power of two >= 16"),
])
def test_attention_options_reject_bad_values_naming_the_valid_ones(kwargs, match):
  with pytest.raises(ValueError, match=match):
    AttentionOptions(**kwargs)


def test_attention_options_from_the_flat_config_keys():
  config = dict(attention="relu2", seqlen_alpha=0.5, qk_norm=True, gated=True,
                gate_activation="silu", attention_impl="seq_parallel", attention_block_size=64,
                mesh=[("data", -1), ("seq", 1)], seq_axis="seq", pool_type="tok")
  options = AttentionOptions.from_config(config)  # pool_type is not an attention option
  assert (options.activation, options.seqlen_alpha, options.qk_norm, options.gated,
          options.gate_activation, options.impl, options.block_size, options.seq_axis) == (
              "relu2", 0.5, True, True, "silu", "seq_parallel", 64, "seq")
  assert options.mesh.axis_names == ("data", "seq")  # built from config.mesh-style axes
  assert AttentionOptions.from_config({}) == AttentionOptions()
  with pytest.raises(ValueError, match="no sequence axis seq_axis='seq'"):
    AttentionOptions.from_config(dict(mesh=[("data", -1)]))
