"""mixup: same ratio for images and labels, mixed with the batch rolled by one, Beta(p, p).

Each test compiles one function (sampling Beta/Dirichlet takes seconds to compile on CPU).
"""
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from big_vision_relu.data.mixup import mixup


def auto_mesh():
  """8-device data mesh with Auto axes, as big_vision_relu.sharding.make_mesh builds it."""
  return jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def batch(b=8):
  rng = np.random.default_rng(0)
  return {"image": jnp.asarray(rng.normal(size=(b, 4, 4, 3)), jnp.float32),
          "labels": jnp.eye(b, dtype=jnp.float32)}


def expected(x, lam):
  """lam * x + (1 - lam) * x rolled by one along the batch."""
  return lam * x + (1 - lam) * np.roll(x, 1, axis=0)


def test_shared_lambda_rolled_batch_and_beta_distribution():
  p, x = 0.2, batch()
  out = jax.jit(jax.vmap(lambda k: mixup(k, x, p=p)))(jax.random.split(jax.random.key(0), 2000))
  # labels = lam * I + (1 - lam) * roll(I, 1): row 0 has lam at column 0.
  lams = np.asarray(out["labels"][:, 0, 0])
  for i in range(3):
    np.testing.assert_allclose(out["labels"][i], expected(x["labels"], lams[i]), atol=1e-6)
    np.testing.assert_allclose(out["image"][i], expected(x["image"], lams[i]), atol=1e-5)
  # Beta(p, p): mean 1/2, variance 1 / (4 (2p + 1)).
  assert abs(lams.mean() - 0.5) < 0.03
  assert abs(lams.var() - 1 / (4 * (2 * p + 1))) < 0.02


def test_sharded_tuple_of_arrays_with_three_copies():
  b = batch(16)
  images, labels = jax.device_put((b["image"], b["labels"]),
                                  NamedSharding(auto_mesh(), P("data")))
  mix3 = jax.jit(functools.partial(mixup, p=1.0, n=3))
  out_images, out_labels = mix3(jax.random.key(3), (images, labels))
  assert out_images.sharding.spec == P("data")
  ratio = np.asarray(out_labels[0, np.array([0, 15, 14])])  # Row 0 mixes rows 0, -1, -2.
  assert (ratio > 0).all() and abs(ratio.sum() - 1) < 1e-6
  x = np.asarray(images)
  np.testing.assert_allclose(
      out_images, sum(r * np.roll(x, i, axis=0) for i, r in enumerate(ratio)), atol=1e-5)


def test_errors_are_raised_before_sampling():
  with pytest.raises(TypeError, match="float"):
    mixup(jax.random.key(0), {"label": jnp.arange(4)}, p=0.5)
  with pytest.raises(ValueError, match="p must be"):
    mixup(jax.random.key(0), jnp.eye(2), p=0.0)
  with pytest.raises(ValueError, match="n must be"):
    mixup(jax.random.key(0), jnp.eye(2), p=0.5, n=1)


def test_fold_in_gives_each_shard_its_own_ratio():
  labels = jnp.tile(jnp.eye(2), (8, 1))  # Every device holds [[1, 0], [0, 1]].
  f = jax.shard_map(lambda l: mixup(jax.random.key(4), l, p=1.0, fold_in="data"),
                    mesh=auto_mesh(), in_specs=P("data"), out_specs=P("data"))
  lams = np.asarray(jax.jit(f)(labels))[::2, 0]
  assert len(set(lams.round(6))) == 8
