"""attention_impl='pallas' (fused Pallas kernels) == the dense path and a float64 reference.

On CPU the kernels run in Pallas's interpreters, so these tests check the kernels' maths (tiles,
the loops over tiles, rows past the lengths masked inside the kernels, the backward's five
products) but not their speed: the GPU (Triton) kernels in the Pallas interpreter, the CPU
default of `pallas_pointwise_attention`; the TPU (Mosaic) kernels in Pallas's TPU interpreter
(`pltpu.InterpretParams`), whose reads past an array give NaN, as the plain interpreter's do, so
an unmasked padded row would show. Lengths are deliberately not multiples of the tile. Both
kernel families are also lowered for their platform on this CPU host (Triton custom calls for
CUDA, Mosaic custom calls for a TPU). Compiling and running them needs the device: the tests
marked `gpu` run the Triton kernels on a GPU (`JAX_PLATFORMS=cuda python3 -m pytest -m gpu
tests/test_pallas_attention.py` there) and are skipped elsewhere.
"""
import collections
import contextlib
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental.pallas import tpu as pltpu
from jax.extend import core as jax_core

from big_vision_relu.models import attention as attn
from big_vision_relu.models import pallas_gpu, pallas_tpu, vit
from big_vision_relu.models.attention import AttentionOptions
from big_vision_relu.models.multihead import MultiHeadDotProductAttention
from big_vision_relu.models.pallas_attention import pallas_pointwise_attention
from big_vision_relu.models.pallas_tiles import TileSpec

import numpy_reference as ref

ALPHAS = (0.0, 1.0, 1.5)
on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason=(
    "needs a GPU: the compiled Triton kernels (JAX_PLATFORMS=cuda python3 -m pytest -m gpu "
    "tests/test_pallas_attention.py on a GPU machine)"))


def pallas(activation="relu", alpha=1.0, block_size=None, precision=None):
  """pallas_pointwise_attention(q, k, v) with these options."""
  return functools.partial(pallas_pointwise_attention, AttentionOptions(
      activation=activation, seqlen_alpha=alpha, impl="pallas", block_size=block_size,
      precision=precision))


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


def assert_close(got, want, tol, case=""):
  for name, g, w in zip(("output", "dq", "dk", "dv"), got, want, strict=True):
    assert relative_error(g, w) <= tol, (case, name, relative_error(g, w))


@pytest.mark.parametrize("activation", tuple(attn.ACTIVATIONS))
def test_pallas_equals_dense_and_float64_in_float32_and_bfloat16(activation):
  """The GPU kernels in the Pallas interpreter: 33 queries and keys in tiles of 16 (3 tiles, 15
  padded); every alpha in float32, alpha 1.5 in bf16, where the error must also stay within 2x
  that of a naive bf16 dense attention (bf16 scores and weights), both measured against
  float32: FlashSigmoid's rule."""
  q, k, v, d_out = qkv_dout(33, 33, 64)
  qb, kb, vb, db = (x.astype(jnp.bfloat16) for x in (q, k, v, d_out))

  @jax.jit
  def run(q, k, v, d_out, qb, kb, vb, db):
    results = {}
    for alpha in ALPHAS:
      results[f"pallas {alpha}"] = output_and_grads(pallas(activation, alpha, 16), q, k, v, d_out)
      results[f"dense {alpha}"] = output_and_grads(functools.partial(
          attn.dot_product_attention, activation=activation, seqlen_alpha=alpha), q, k, v, d_out)
    kw = dict(activation=activation, seqlen_alpha=1.5)
    results["pallas bf16"] = output_and_grads(pallas(activation, 1.5, 16), qb, kb, vb, db)
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
  for name, fused, naive, w in zip(("output", "dq", "dk", "dv"), results["pallas bf16"],
                                   results["naive bf16"], want, strict=True):
    assert relative_error(fused, w) <= 2 * relative_error(naive, w), name


@pytest.mark.parametrize("activation,dtype,head_dim,lq,lk,block_size", [
    ("gelu", jnp.float32, 128, 197, 197, 128),  # S/16's length: 2 tiles of 128, 59 padded
    ("softplus", jnp.bfloat16, 128, 1, 1, 128),  # one token: a tile of 16, 15 padded
    ("sigmoid", jnp.float32, 64, 785, 785, 128),  # S/8's length: 7 tiles, 111 padded
    ("relu2", jnp.bfloat16, 64, 5, 40, 16),  # cross attention: 1 query tile, 3 key tiles
    ("gelu", jnp.float32, 72, 20, 20, 16),  # So400m's head dim: 72 of 128 columns, masked
])
def test_pallas_at_awkward_lengths_and_head_dims(activation, dtype, head_dim, lq, lk,
                                                 block_size):
  """Padded keys must add nothing although h(0) != 0 for gelu, softplus and sigmoid, and the
  scale is the true key length (alpha 1.5)."""
  q, k, v, d_out = qkv_dout(lq, lk, head_dim, dtype, h=1)
  got = jax.jit(lambda *x: output_and_grads(pallas(activation, 1.5, block_size), *x))(q, k, v,
                                                                                d_out)
  assert_close(got, float64_reference(q, k, v, d_out, activation, 1.5),
               1e-5 if dtype == jnp.float32 else 2e-2)


def tpu_kernels(activation, alpha, q, k, v, d_out, block_size=128):
  """(output, dq, dk, dv) of the Mosaic TPU kernels in Pallas's TPU interpreter."""
  options = AttentionOptions(activation=activation, seqlen_alpha=alpha, impl="pallas",
                             block_size=block_size)
  spec = TileSpec(options, q.shape[1], k.shape[1], np.dtype(v.dtype))
  interpret = pltpu.InterpretParams()
  return [pallas_tpu.forward(spec, q, k, v, interpret=interpret),
          *pallas_tpu.backward(spec, q, k, v, d_out, interpret=interpret)]


def test_tpu_kernels_in_tpu_interpret_mode_equal_float64_for_every_activation():
  """S/16's 197 tokens in TPU tiles of 128 (2 tiles, 59 rows past the array: NaN in the
  interpreter until masked), float32, alphas 0, 1 and 1.5 in turn (two heads: the bf16 test)."""
  q, k, v, d_out = qkv_dout(197, 197, 64, h=1)
  cases = [(a, ALPHAS[i % len(ALPHAS)]) for i, a in enumerate(attn.ACTIVATIONS)]
  results = jax.jit(lambda *x: [tpu_kernels(a, alpha, *x) for a, alpha in cases])(q, k, v, d_out)
  for (activation, alpha), got in zip(cases, results, strict=True):
    assert_close(got, float64_reference(q, k, v, d_out, activation, alpha), 1e-5,
                 (activation, alpha))


def test_tpu_kernels_in_bfloat16_and_cross_attention():
  """bf16: 197 tokens (relu, gelu) within 2e-2 of float64 on the bf16-rounded inputs and
  within 2x a naive bf16 dense attention's error; float32 cross attention: 5 queries (one tile
  of 128) x 300 keys (tiles of 128 under block_size 256: 3, 84 past the array)."""
  qb, kb, vb, db = qkv_dout(197, 197, 64, jnp.bfloat16)
  q, k, v, d_out = qkv_dout(5, 300, 64, h=1, seed=1)

  @jax.jit
  def run(qb, kb, vb, db, q, k, v, d_out):
    results = {a: tpu_kernels(a, 1.0, qb, kb, vb, db) for a in ("relu", "gelu")}
    results |= {f"naive {a}": output_and_grads(functools.partial(
        attn.dot_product_attention, activation=a, float32_scores=False), qb, kb, vb, db)
        for a in ("relu", "gelu")}
    results["cross"] = tpu_kernels("softplus", 0.5, q, k, v, d_out, block_size=256)
    return results

  results = run(qb, kb, vb, db, q, k, v, d_out)
  assert pallas_tpu.tile_len(300, 256) == 256 and pallas_tpu.tile_len(197, 512) == 256
  for activation in ("relu", "gelu"):
    want = float64_reference(qb, kb, vb, db, activation, 1.0)
    assert_close(results[activation], want, 2e-2, activation)
    for fused, naive, w in zip(results[activation], results[f"naive {activation}"], want,
                               strict=True):
      assert relative_error(fused, w) <= 2 * relative_error(naive, w), activation
  assert [x.dtype for x in results["relu"]] == [jnp.bfloat16] * 4
  assert_close(results["cross"], float64_reference(q, k, v, d_out, "softplus", 0.5), 1e-5)


def test_vit_with_pallas_attention_equals_dense():
  """Loss and parameter gradients of a one-block ViT (17 tokens: 2 tiles of 16)."""
  images = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 32, 3))
  labels = jax.nn.one_hot(jnp.arange(2), 3)
  small = dict(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=(8, 8), pool_type="tok",
               attention="gelu", seqlen_alpha=1.0, head_zeroinit=False)
  models = {impl: vit.Model(3, **small, attention_impl=impl, attention_block_size=block)
            for impl, block in (("dense", None), ("pallas", 16))}
  params = jax.jit(models["dense"].init)(jax.random.PRNGKey(0), images)["params"]

  @jax.jit
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


def _vit_loss_gradient(activation, dtype, trace_under=contextlib.nullcontext):
  """A traced `jax.grad` of a one-block ViT's loss (head dim 64, 17 tokens), pallas attention,
  traced inside the context `trace_under()`."""
  model = vit.Model(3, width=128, depth=1, mlp_dim=128, num_heads=2, patch_size=(8, 8),
                    pool_type="tok", attention=activation, attention_impl="pallas",
                    dtype_mm=dtype)
  images = jnp.zeros((2, 32, 32, 3))
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]

  def loss(params):
    logits, _ = model.apply({"params": params}, images)
    return jnp.mean(jax.nn.log_softmax(logits)[:, 0])
  with trace_under():
    return jax.jit(jax.grad(loss)).trace(params)


@contextlib.contextmanager
def _an_h200():
  """Traces inside target an H200 (the GPU this project measures on): jax >= 0.11's Triton
  lowering reads the compute capability from a device, which a CPU host has only as the
  abstract one of the abstract mesh a function was traced under."""
  h200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="gpu")
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("data",),
                                                                abstract_device=h200)):
    yield


def test_vit_loss_gradient_lowers_to_mosaic_kernels_for_a_tpu_and_triton_for_a_gpu():
  """Lowered for a TPU (on this CPU host), a ViT's loss gradient runs its attention as two
  Mosaic kernels (forward, backward) for every activation in bf16 and for gelu (the erfc of
  exact gelu) in float32 too; lowered for CUDA, as two Triton kernels; compiled here, as the
  Pallas interpreter, with neither."""
  cases = [(activation, "bfloat16") for activation in attn.ACTIVATIONS] + [("gelu", "float32")]
  for activation, dtype in cases:
    traced = _vit_loss_gradient(activation, dtype)
    tpu = traced.lower(lowering_platforms=("tpu",)).as_text()
    cuda = _vit_loss_gradient(activation, dtype, _an_h200).lower(
        lowering_platforms=("cuda",)).as_text()
    case = (activation, dtype)
    assert len(re.findall(r"custom_call @tpu_custom_call", tpu)) == 2, case
    assert len(re.findall(r"custom_call @__gpu\$xla\.gpu\.triton", cuda)) == 2, case
    assert "triton" not in tpu and "tpu_custom_call" not in cuda, case
  cpu = traced.lower().as_text()
  assert "triton" not in cpu and "tpu_custom_call" not in cpu


def test_pallas_kernels_lower_to_triton_for_a_gpu_at_head_dims_64_and_128():
  """Lowered for CUDA, forward and backward are two Triton kernels at lengths that are not
  powers of two (197, 785) and head dims 64, 128 and 72 (padded to 128 columns)."""
  def step(q):
    out, vjp = jax.vjp(pallas("gelu"), q, q, q)
    return out, vjp(out)

  for dtype, length, head_dim in ((jnp.float32, 197, 128), (jnp.bfloat16, 785, 64),
                                  (jnp.bfloat16, 197, 72)):
    q = jnp.zeros((2, length, 3, head_dim), dtype)
    with _an_h200():
      cuda = jax.jit(step).trace(q).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @__gpu\$xla\.gpu\.triton", cuda)) == 2, (dtype, length)


def _kernel_primitives(fn, *args):
  """{(primitive, inside the kernel's loop): count} of the one Pallas kernel `fn` calls, and
  the primitives of the XLA program around it."""
  def walk(jaxpr, counts, in_loop):
    for eqn in jaxpr.eqns:
      counts[eqn.primitive.name, in_loop] += 1
      for param in eqn.params.values():
        for sub in param if isinstance(param, (list, tuple)) else [param]:
          sub = sub.jaxpr if isinstance(sub, jax_core.ClosedJaxpr) else sub
          if isinstance(sub, jax_core.Jaxpr) and eqn.primitive.name != "pallas_call":
            walk(sub, counts, in_loop or eqn.primitive.name in ("scan", "while"))
    return counts

  outer = jax.make_jaxpr(fn)(*args).jaxpr
  (kernel,) = [eqn.params["jaxpr"] for eqn in outer.eqns if eqn.primitive.name == "pallas_call"]
  return walk(kernel, collections.Counter(), False), walk(outer, collections.Counter(), False)


def test_backward_kernels_do_five_products_per_tile_pair_and_no_transposes():
  """The least work: the GPU backward's loop over query tiles does 5 products per tile pair
  (S^T, dP^T, dv, dk, dq^T), one atomic add of dq^T and no transpose (the key tile is transposed
  once, outside it); the TPU backward does the same 5 products per grid step with none; the
  forwards do 2. Around the kernels XLA pads nothing (the kernels mask the last tile)."""
  spec = TileSpec(AttentionOptions(activation="gelu", impl="pallas"), 197, 197,
                  np.dtype(jnp.bfloat16))
  q = jnp.zeros((1, 197, 2, 64), jnp.bfloat16)
  gpu_fwd, gpu_fwd_xla = _kernel_primitives(functools.partial(pallas_gpu.forward, spec), q, q, q)
  gpu_bwd, gpu_bwd_xla = _kernel_primitives(functools.partial(pallas_gpu.backward, spec),
                                            q, q, q, q)
  tpu_fwd, tpu_fwd_xla = _kernel_primitives(functools.partial(pallas_tpu.forward, spec), q, q, q)
  tpu_bwd, tpu_bwd_xla = _kernel_primitives(functools.partial(pallas_tpu.backward, spec),
                                            q, q, q, q)
  assert gpu_fwd["dot_general", True] == 2 and gpu_fwd["dot_general", False] == 0
  assert gpu_bwd["dot_general", True] == 5 and gpu_bwd["dot_general", False] == 0
  assert gpu_bwd["atomic_rmw", True] == 1
  assert gpu_bwd["transpose", True] == 0 and gpu_bwd["transpose", False] == 1
  assert tpu_fwd["dot_general", False] == 2 and tpu_bwd["dot_general", False] == 5
  assert tpu_bwd["transpose", False] == 0
  for xla in (gpu_fwd_xla, gpu_bwd_xla, tpu_fwd_xla, tpu_bwd_xla):
    assert not any(name == "pad" for name, _ in xla)


@pytest.mark.parametrize("call,match", [
    (lambda q: vit.Model(3, variant="mu/8", attention="softmax",
                         attention_impl="pallas").validate(),
     "'chunked', 'seq_parallel' and 'pallas' with the pointwise ones"),
    (lambda q: pallas()(q, q, q, mask=jnp.ones((5, 5), bool)),
     "attention_impl='pallas' takes no mask"),
    (lambda q: MultiHeadDotProductAttention(
        num_heads=2, options=AttentionOptions(activation="relu", impl="pallas"))
     .init(jax.random.PRNGKey(0), q[:, :, 0], mask=jnp.ones((5, 5), bool)),
     "attention_impl='pallas' takes no mask"),
    (lambda q: pallas(block_size=96)(q, q, q), "a power of two >= 16"),
    (lambda q: pallas_pointwise_attention(AttentionOptions(activation="relu", impl="chunked"),
                                          q, q, q), r"needs AttentionOptions\(impl='pallas'"),
    (lambda q: pallas()(q, q, q[..., :4]), "values as wide as the queries"),
    # 65536 queries x head dim 128: a 32 MiB float32 dq block, more than a TPU kernel's VMEM.
    (lambda q: jax.eval_shape(functools.partial(pallas_tpu.backward, TileSpec(
        AttentionOptions(activation="relu", impl="pallas"), 65536, 65536, np.dtype("float32"))),
        *[jax.ShapeDtypeStruct((1, 65536, 1, 128), jnp.float32)] * 4),
     "keeps one head's float32 dq in VMEM: 65536 queries x head dim 128 need 32 MiB"),
])
def test_pallas_rejects_softmax_masks_and_bad_tiles(call, match):
  with pytest.raises(ValueError, match=match):
    call(jnp.ones((1, 5, 2, 8)))


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_compiled_triton_kernels_equal_float64_on_a_gpu(dtype):
  """Compiled on a GPU, batch 2 x 3 heads: in bf16 every activation at S/16's length (197),
  within 2e-2 of float64 and 2x a naive bf16 dense attention's error; in float32 (HIGHEST
  precision: IEEE products, not TF32) relu and gelu at 197, within 1e-5; in both relu at S/8's
  length (785) and gelu in a cross attention (5 x 300, head dim 128)."""
  bf16 = dtype == jnp.bfloat16
  tol, precision = (2e-2, None) if bf16 else (1e-5, lax.Precision.HIGHEST)
  cases = [(a, 197, 197, 64) for a in (attn.ACTIVATIONS if bf16 else ("relu", "gelu"))]
  cases += [("relu", 785, 785, 64), ("gelu", 5, 300, 128)]
  for activation, lq, lk, head_dim in cases:
    q, k, v, d_out = qkv_dout(lq, lk, head_dim, dtype, b=2, h=3)
    got = jax.jit(lambda *x, a=activation: output_and_grads(
        pallas(a, 1.5, precision=precision), *x))(q, k, v, d_out)
    want = float64_reference(q, k, v, d_out, activation, 1.5)
    assert_close(got, want, tol, (activation, lq, lk, head_dim))
    if bf16:
      naive = jax.jit(lambda *x, a=activation: output_and_grads(functools.partial(
          attn.dot_product_attention, activation=a, seqlen_alpha=1.5, float32_scores=False),
          *x))(q, k, v, d_out)
      for fused, slow, w in zip(got, naive, want, strict=True):
        assert relative_error(fused, w) <= 2 * relative_error(slow, w), (activation, lq)


@pytest.mark.gpu
@on_gpu
def test_cudnn_impl_equals_dense_softmax_on_a_gpu():
  """attention_impl='cudnn' (here, as the other GPU kernels): a bf16 S/16-like ViT block's loss
  and gradients (197 tokens, padded to 198 for cuDNN) equal the dense softmax path's."""
  images = jax.random.normal(jax.random.PRNGKey(1), (4, 224, 224, 3))
  small = dict(width=384, depth=1, mlp_dim=256, num_heads=6, patch_size=(16, 16),
               pool_type="tok", attention="softmax", head_zeroinit=False)
  models = {impl: vit.Model(3, **small, attention_impl=impl) for impl in ("dense", "cudnn")}
  params = jax.jit(models["dense"].init)(jax.random.PRNGKey(0), images)["params"]

  def loss(params, model):
    logits, _ = model.apply({"params": params}, images)
    return jnp.mean(jax.nn.log_softmax(logits)[:, 0])
  results = {impl: jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, model)
             for impl, model in models.items()}
  np.testing.assert_allclose(results["cudnn"][0], results["dense"][0], rtol=1e-4)
  for got, want in zip(jax.tree.leaves(results["cudnn"][1]), jax.tree.leaves(results["dense"][1]),
                       strict=True):
    assert relative_error(got, want) <= 1e-3
