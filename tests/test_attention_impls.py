"""Blockwise attention implementations (chunked, seq_parallel) == the dense path (pallas:
tests/test_pallas_attention.py).

Tiny shapes; the sequence lengths are deliberately not multiples of the block or ring size, so
the zero padding is exercised. 8 simulated devices come from conftest.py.
"""
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from big_vision_relu import sharding
from big_vision_relu import run as run_lib
from big_vision_relu import train as train_lib
from big_vision_relu.models import attention as attn
from big_vision_relu.models import blockwise, cudnn_attention, vit
from big_vision_relu.models.attention import AttentionOptions
from big_vision_relu.models.multihead import MultiHeadDotProductAttention

from trainer_processes import tiny_config

POINTWISE = tuple(attn.ACTIVATIONS)
ALPHAS = (0.0, 1.0, 2.0)
MESH_AXES = [("data", 2), ("seq", 4)]


def qkv(b=2, lq=13, lk=11, h=2, d=4):
  ks = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v = (jax.random.normal(kk, (b, n, h, d)) for kk, n in zip(ks, (lq, lk, lk), strict=False))
  d_out = jax.random.normal(ks[3], (b, lq, h, d))  # a generic output cotangent
  return q, k, v, d_out


def outputs_and_grads(fn, q, k, v, d_out):
  """fn(q, k, v) -> (output, (dq, dk, dv) of <output, d_out>)."""
  out, vjp = jax.vjp(fn, q, k, v)
  return out, vjp(d_out)


def assert_close(got, want, tol=1e-5):
  """|got - want| <= tol * (1 + |want|) elementwise, for every leaf."""
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("activation", POINTWISE)
def test_chunked_equals_dense_outputs_and_grads(activation):
  q, k, v, d_out = qkv()

  @jax.jit
  def both(q, k, v, d_out):  # one compilation per activation, every alpha inside
    results = []
    for alpha in ALPHAS:
      kw = dict(activation=activation, seqlen_alpha=alpha)
      dense = lambda q, k, v, kw=kw: attn.dot_product_attention(q, k, v, **kw)  # noqa: E731
      # 13 queries -> 4 blocks of 4; 11 keys -> 3 of 4
      chunked = functools.partial(blockwise.chunked_pointwise_attention,
                                  AttentionOptions(impl="chunked", block_size=4, **kw))
      results.append((outputs_and_grads(chunked, q, k, v, d_out),
                      outputs_and_grads(dense, q, k, v, d_out)))
    return results

  for alpha, (got, want) in zip(ALPHAS, both(q, k, v, d_out), strict=True):
    assert_close(got, want), (activation, alpha)


def test_chunked_keeps_batch_dims_dtype_and_blocks_within_block_size():
  q, k, v, _ = qkv(lq=9, lk=9)
  q, k, v = (x.reshape(1, 2, 9, 2, 4).astype(jnp.bfloat16) for x in (q, k, v))
  out = jax.jit(functools.partial(blockwise.chunked_pointwise_attention, AttentionOptions(
      activation="relu", impl="chunked", block_size=4)))(q, k, v)
  assert out.shape == (1, 2, 9, 2, 4) and out.dtype == jnp.bfloat16
  dense = attn.dot_product_attention(q, k, v)
  np.testing.assert_allclose(out.astype(np.float32), dense.astype(np.float32), atol=2e-2)
  assert blockwise.block_len(197, 128) == (99, 198)  # equal blocks, least padding
  assert blockwise.block_len(8192, 512) == (512, 8192)


def test_seq_parallel_equals_dense_on_8_devices():
  assert jax.device_count() == 8
  mesh = sharding.make_mesh(MESH_AXES)
  q, k, v, d_out = qkv(b=4, lq=13, lk=13)  # 13 tokens over 4 devices: padded to 4 x 4
  batch = NamedSharding(mesh, P("data"))  # the batch stays data-parallel, as in the trainer

  @jax.jit
  def both(q, k, v, d_out):
    results = []
    for activation, alpha in (("relu", 1.0), ("gelu", 2.0)):
      kw = dict(activation=activation, seqlen_alpha=alpha)
      # 4 local tokens -> 2 blocks of 2
      ring = functools.partial(blockwise.seq_parallel_pointwise_attention, AttentionOptions(
          impl="seq_parallel", mesh=mesh, block_size=3, **kw))
      dense = lambda q, k, v, kw=kw: attn.dot_product_attention(q, k, v, **kw)  # noqa: E731
      results.append((outputs_and_grads(ring, q, k, v, d_out),
                      outputs_and_grads(dense, q, k, v, d_out)))
    return results

  for got, want in both(*jax.device_put((q, k, v, d_out), batch)):
    assert_close(got, want)


def test_seq_parallel_uses_the_context_mesh_and_needs_the_axis():
  q, k, v, _ = qkv(lq=8, lk=8)
  ring = functools.partial(blockwise.seq_parallel_pointwise_attention,
                           AttentionOptions(activation="relu", impl="seq_parallel"))
  with jax.set_mesh(sharding.make_mesh(MESH_AXES)):
    out = jax.jit(ring)(q, k, v)
  assert_close(out, attn.dot_product_attention(q, k, v))
  with jax.set_mesh(sharding.make_mesh([("data", -1)])), pytest.raises(
      ValueError, match="no sequence axis seq_axis='seq'"):
    ring(q, k, v)


@pytest.mark.parametrize("kw,match", [
    (dict(attention="softmax", attention_impl="chunked"),
     "Valid combinations: attention_impl='dense' with any attention"),
    (dict(attention="relu", attention_impl="flash"), "valid: dense, chunked, seq_parallel, pallas"),
    (dict(attention="relu", attention_impl="seq_parallel", mesh=[("data", -1)]),
     "no sequence axis seq_axis='seq'"),
])
def test_bad_impl_configs_raise(kw, match):
  with pytest.raises(ValueError, match=match):
    vit.Model(3, variant="mu/8", **kw).validate()


def test_blockwise_paths_reject_masks_and_sown_weights():
  q, k, v, _ = qkv()
  with pytest.raises(ValueError, match="takes no mask"):
    blockwise.chunked_pointwise_attention(AttentionOptions(activation="relu", impl="chunked"),
                                          q, k, v, mask=jnp.ones((13, 11), bool))
  with pytest.raises(ValueError, match=r"needs AttentionOptions\(impl='chunked', ...\), got "
                     "impl='dense'"):
    blockwise.chunked_pointwise_attention(AttentionOptions(activation="relu"), q, k, v)
  module = MultiHeadDotProductAttention(
      num_heads=2, options=AttentionOptions(activation="relu", impl="chunked"))
  with pytest.raises(ValueError, match="sow_weights=True needs impl='dense'"):
    module.init(jax.random.PRNGKey(0), jnp.ones((1, 5, 8)), sow_weights=True)


def test_vit_trained_in_the_trainer_step_with_each_impl_matches_dense(offline_data_dir):
  """A few steps of the trainer's own jitted update (state sharded as in `train`, batch over
  'data' of a data 2 x seq 4 mesh) with each implementation; ViT width 16, depth 1, 17 tokens."""
  config = tiny_config(offline_data_dir, mesh=MESH_AXES)
  config.model = ml_collections.ConfigDict(dict(config.model, pool_type="tok"))
  run = run_lib.setup(config)
  state0 = jax.jit(run.init_state, out_shardings=run.state_shardings)(jax.random.PRNGKey(0))
  batch = jax.device_put(
      dict(image=jax.random.normal(jax.random.PRNGKey(1), (16, 28, 28, 1)),
           labels=jax.nn.one_hot(jnp.arange(16) % 10, 10)),
      NamedSharding(run.mesh, P(run_lib.DATA_AXIS)))
  impls = {"dense": {}, "chunked": dict(attention_block_size=16),
           "seq_parallel": dict(mesh=MESH_AXES, attention_block_size=8),
           "pallas": dict(attention_block_size=16)}
  trained = {}
  for impl, kw in impls.items():
    model = vit.Model(config.num_classes, **config.model, attention_impl=impl, **kw)
    update = jax.jit(run_lib.make_update_fn(model, run.tx, run.config),
                     in_shardings=(run.state_shardings, None),
                     out_shardings=(run.state_shardings, None))
    state, losses = state0, []
    for _ in range(3):
      state, metrics = update(state, batch)
      losses.append(float(metrics["training_loss"]))
    trained[impl] = state["params"], losses
  assert len(set(trained["dense"][1])) == 3  # the steps changed the params
  for impl in ("chunked", "seq_parallel", "pallas"):
    np.testing.assert_allclose(trained[impl][1], trained["dense"][1], rtol=1e-5)
    assert_close(trained[impl][0], trained["dense"][0])


def test_trainer_runs_seq_parallel_from_config_mesh_alone(offline_data_dir, tmp_path):
  """`train` makes config.mesh the context mesh, so seq_parallel needs no config.model.mesh:
  3 steps on a data 2 x seq 4 mesh with an evaluator == the same run with dense attention; a
  mesh without the sequence axis fails before anything compiles."""
  results = {}
  for impl in ("dense", "seq_parallel"):
    config = tiny_config(offline_data_dir, mesh=MESH_AXES, total_steps=3)
    config.model = ml_collections.ConfigDict(dict(config.model, pool_type="tok",
                                                  attention_impl=impl, attention_block_size=8))
    config.evals.test = dict(type="classification", data=dict(config.input.data, split="test"),
                             pp_fn=config.input.pp, batch_size=16)
    results[impl] = train_lib.train(config, str(tmp_path / impl))
  for key in ("training_loss", "test/prec@1", "test/loss"):
    np.testing.assert_allclose(results["seq_parallel"][key], results["dense"][key], rtol=1e-5)
  config.mesh = [("data", -1)]
  with pytest.raises(ValueError, match="lacks; use e.g. config.mesh="):
    run_lib.setup(config)


def test_cudnn_impl_pads_odd_lengths_and_masks_them_by_sequence_lengths():
  """attention_impl='cudnn' (softmax, a GPU only) pads odd lengths to even ones for cuDNN and
  masks the padding by the true lengths: run here by XLA with the same padding and lengths, the
  output and q/k/v gradients equal the dense softmax's, for self attention (13 tokens) and
  cross attention (13 queries, 11 keys); an even length goes unpadded."""
  q, k, v, d_out = qkv()
  dense = functools.partial(attn.dot_product_attention, activation="softmax")
  padded = functools.partial(cudnn_attention.padded_softmax, implementation="xla")
  got, want = jax.jit(lambda q, k, v, d_out: [
      [outputs_and_grads(fn, q, k, v, d_out), outputs_and_grads(fn, q, q, q, d_out)]
      for fn in (padded, dense)])(q, k, v, d_out)
  assert_close(got, want)
  even = jax.make_jaxpr(padded)(q[:, :12], k[:, :12], v[:, :12])
  assert not any(eqn.primitive.name == "pad" for eqn in even.jaxpr.eqns)
  with pytest.raises(ValueError, match="'cudnn' is cuDNN's softmax flash attention"):
    vit.Model(3, variant="mu/8", attention="relu", attention_impl="cudnn").validate()
  with pytest.raises(ValueError, match="attention_impl='cudnn' takes no mask"):
    cudnn_attention.cudnn_softmax_attention(AttentionOptions(impl="cudnn"), q, k, v,
                                            mask=jnp.ones((13, 11), bool))
