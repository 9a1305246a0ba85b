"""attention_impl='pallas' (fused Pallas kernels) == the dense path and a float64 reference.

On CPU the kernels run in the Pallas interpreter, so these tests check the kernels' maths (tiles,
the in-kernel loop over blocks, zero padding to whole tiles, the hand-written backward) but not
their speed. Lengths are deliberately not multiples of the tile. The GPU (Triton) lowering of
every kernel is checked by lowering for CUDA on this CPU host; compiling and running it needs a
GPU (benchmarks/pallas_attention.py).
"""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from big_vision_relu.models import attention as attn
from big_vision_relu.models import vit
from big_vision_relu.models.attention import AttentionOptions
from big_vision_relu.models.multihead import MultiHeadDotProductAttention
from big_vision_relu.models.pallas_attention import pallas_pointwise_attention

import numpy_reference as ref

ALPHAS = (0.0, 1.0, 1.5)
# LLVM's optimisation is most of these tiny programs' compile time and none of what is tested.
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def qkv_dout(lq, lk, d, dtype=jnp.float32, b=1, h=2, seed=0):
  """Normal q, k, v and output cotangent, rounded to `dtype`."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  shapes = [(b, lq, h, d), (b, lk, h, d), (b, lk, h, d), (b, lq, h, d)]
  return [jax.random.normal(key, shape).astype(dtype) for key, shape in zip(keys, shapes,
                                                                             strict=True)]


def output_and_grads(fn, q, k, v, d_out):
  """fn(q, k, v) -> (output, dq, dk, dv) of <output, d_out>, all float32."""
  out, vjp = jax.vjp(fn, q, k, v)
  return [x.astype(jnp.float32) for x in (out, *vjp(d_out.astype(out.dtype)))]


def float64_reference(q, k, v, d_out, activation, alpha):
  """(output, dq, dk, dv) in float64 numpy (tests/numpy_reference.py)."""
  out, _ = ref.attention(q, k, v, activation, alpha)
  return [out, *ref.attention_grads(q, k, v, d_out, activation, alpha)]


def relative_error(got, want) -> float:
  """max |got - want| / max |want|: one number per array, comparable across dtypes."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.abs(got - want).max() / max(np.abs(want).max(), np.finfo(np.float32).tiny))


def assert_close(got, want, tol):
  for name, g, w in zip(("output", "dq", "dk", "dv"), got, want, strict=True):
    assert relative_error(g, w) <= tol, (name, relative_error(g, w))


@pytest.mark.parametrize("activation", tuple(attn.ACTIVATIONS))
def test_pallas_equals_dense_and_float64_in_float32_and_bfloat16(activation):
  """33 queries and keys in tiles of 16 (3 tiles, 15 padded); every alpha in float32, alpha 1.5
  in bf16, where the error must also stay within 2x that of a naive bf16 dense attention (bf16
  scores and weights), both measured against float32: FlashSigmoid's rule."""
  q, k, v, d_out = qkv_dout(33, 33, 64)
  qb, kb, vb, db = (x.astype(jnp.bfloat16) for x in (q, k, v, d_out))

  @jit
  def run(q, k, v, d_out, qb, kb, vb, db):
    results = {}
    for alpha in ALPHAS:
      kw = dict(activation=activation, seqlen_alpha=alpha)
      results[f"pallas {alpha}"] = output_and_grads(functools.partial(
          pallas_pointwise_attention, block_size=16, **kw), q, k, v, d_out)
      results[f"dense {alpha}"] = output_and_grads(functools.partial(
          attn.dot_product_attention, **kw), q, k, v, d_out)
    kw = dict(activation=activation, seqlen_alpha=1.5)
    results["pallas bf16"] = output_and_grads(functools.partial(
        pallas_pointwise_attention, block_size=16, **kw), qb, kb, vb, db)
    results["naive bf16"] = output_and_grads(functools.partial(
        attn.dot_product_attention, float32_scores=False, **kw), qb, kb, vb, db)
    # float32 on the bf16-rounded inputs: what the bf16 paths approximate.
    results["dense f32 of bf16"] = output_and_grads(functools.partial(
        attn.dot_product_attention, **kw), *(x.astype(jnp.float32) for x in (qb, kb, vb, db)))
    return results

  results = run(q, k, v, d_out, qb, kb, vb, db)
  for alpha in ALPHAS:
    assert_close(results[f"pallas {alpha}"], results[f"dense {alpha}"], 1e-5)
    assert_close(results[f"pallas {alpha}"],
                 float64_reference(q, k, v, d_out, activation, alpha), 1e-5)
  want = results["dense f32 of bf16"]
  assert_close(want, float64_reference(qb, kb, vb, db, activation, 1.5), 1e-5)
  assert_close(results["pallas bf16"], want, 2e-2)
  for name, pallas, naive, w in zip(("output", "dq", "dk", "dv"), results["pallas bf16"],
                                    results["naive bf16"], want, strict=True):
    assert relative_error(pallas, w) <= 2 * relative_error(naive, w), name


@pytest.mark.parametrize("activation,dtype,head_dim,lq,lk,block_size", [
    ("gelu", jnp.float32, 128, 197, 197, 128),  # S/16's length: 2 tiles of 128, 59 padded
    ("softplus", jnp.bfloat16, 128, 1, 1, 128),  # one token: a tile of 16, 15 padded
    ("sigmoid", jnp.float32, 64, 785, 785, 128),  # S/8's length: 7 tiles, 111 padded
    ("relu2", jnp.bfloat16, 64, 5, 40, 16),  # cross attention: 1 query tile, 3 key tiles
])
def test_pallas_at_awkward_lengths_and_head_dims(activation, dtype, head_dim, lq, lk,
                                                 block_size):
  """Padded keys must add nothing although h(0) != 0 for gelu, softplus and sigmoid, and the
  scale is the true key length (alpha 1.5)."""
  q, k, v, d_out = qkv_dout(lq, lk, head_dim, dtype, h=1)
  got = jit(lambda *x: output_and_grads(functools.partial(
      pallas_pointwise_attention, activation=activation, seqlen_alpha=1.5,
      block_size=block_size), *x))(q, k, v, d_out)
  assert_close(got, float64_reference(q, k, v, d_out, activation, 1.5),
               1e-5 if dtype == jnp.float32 else 2e-2)


def test_vit_with_pallas_attention_equals_dense():
  """Loss and parameter gradients of a one-block ViT (17 tokens: 2 tiles of 16)."""
  images = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 32, 3))
  labels = jax.nn.one_hot(jnp.arange(2), 3)
  small = dict(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=(8, 8), pool_type="tok",
               attention="gelu", seqlen_alpha=1.0, head_zeroinit=False)
  models = {impl: vit.Model(3, **small, attention_impl=impl, attention_block_size=block)
            for impl, block in (("dense", None), ("pallas", 16))}
  params = jit(models["dense"].init)(jax.random.PRNGKey(0), images)["params"]

  @jit
  def loss_and_grads(params):
    def loss(params, model):
      logits, _ = model.apply({"params": params}, images)
      return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, -1))
    return {impl: jax.value_and_grad(loss)(params, model) for impl, model in models.items()}

  results = loss_and_grads(params)
  np.testing.assert_allclose(results["pallas"][0], results["dense"][0], rtol=1e-6)
  for got, want in zip(jax.tree.leaves(results["pallas"][1]), jax.tree.leaves(results["dense"][1]),
                       strict=True):
    assert relative_error(got, want) <= 1e-5


def test_pallas_kernels_lower_to_triton_for_a_gpu():
  """Lowered for CUDA (on this CPU host), forward and backward are three Triton kernels for
  every activation, bf16 and float32, head dims 64 and 128; compiled here they are the Pallas
  interpreter, with no Triton kernel."""
  def step(activation, q):
    out, vjp = jax.vjp(functools.partial(pallas_pointwise_attention,
                                         activation=activation), q, q, q)
    return out, vjp(out)

  cases = [(activation, jnp.bfloat16, 64) for activation in attn.ACTIVATIONS]
  cases += [("gelu", jnp.float32, 128), ("relu", jnp.bfloat16, 128)]
  for activation, dtype, head_dim in cases:
    q = jnp.zeros((2, 197, 3, head_dim), dtype)
    lowered = jax.jit(functools.partial(step, activation)).trace(q)
    cuda = lowered.lower(lowering_platforms=("cuda",)).as_text()
    kernels = re.findall(r"custom_call @__gpu\$xla\.gpu\.triton", cuda)
    assert len(kernels) == 3, (activation, dtype, head_dim)
  assert "triton" not in lowered.lower().as_text()


@pytest.mark.parametrize("call,match", [
    (lambda q: vit.Model(3, variant="mu/8", attention="softmax",
                         attention_impl="pallas").validate(),
     "'chunked', 'seq_parallel' and 'pallas' with the pointwise ones"),
    (lambda q: pallas_pointwise_attention(q, q, q, mask=jnp.ones((5, 5), bool)),
     "attention_impl='pallas' takes no mask"),
    (lambda q: MultiHeadDotProductAttention(
        num_heads=2, options=AttentionOptions(activation="relu", impl="pallas"))
     .init(jax.random.PRNGKey(0), q[:, :, 0], mask=jnp.ones((5, 5), bool)),
     "attention_impl='pallas' takes no mask"),
    (lambda q: pallas_pointwise_attention(q, q, q, block_size=96),
     "a power of two >= 16"),
])
def test_pallas_rejects_softmax_masks_and_bad_tiles(call, match):
  with pytest.raises(ValueError, match=match):
    call(jnp.ones((1, 5, 2, 8)))
