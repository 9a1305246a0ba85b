"""make_global_batch on 8 simulated CPU devices (conftest sets the XLA flag)."""
import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from big_vision_relu.data import input_pipeline as ip


def host_batch(rows=16):
  rng = np.random.default_rng(0)
  return {"image": rng.normal(size=(rows, 4, 4, 3)).astype(np.float32),
          "labels": rng.random((rows, 10)).astype(np.float32),
          "_mask": rng.random(rows) < 0.5}


def test_one_data_axis_shards_the_batch_over_all_devices():
  assert jax.device_count() == 8
  mesh = jax.make_mesh((8,), ("data",))
  batch = host_batch()
  out = ip.make_global_batch(batch, mesh)
  for k, v in batch.items():
    assert isinstance(out[k], jax.Array) and out[k].shape == v.shape
    assert out[k].sharding.spec == P("data") and out[k].sharding.mesh == mesh
    np.testing.assert_array_equal(np.asarray(out[k]), v)
    assert {s.data.shape[0] for s in out[k].addressable_shards} == {2}
  shards = sorted(out["image"].addressable_shards, key=lambda s: s.index[0].start)
  for i, shard in enumerate(shards):
    np.testing.assert_array_equal(np.asarray(shard.data), batch["image"][2 * i:2 * i + 2])


@pytest.mark.parametrize("data_axis, rows_per_shard", [("data", 4), (("data", "model"), 2)])
def test_two_axis_mesh(data_axis, rows_per_shard):
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  batch = host_batch()
  out = ip.make_global_batch(batch, mesh, data_axis=data_axis)
  assert out["labels"].sharding.spec == P(data_axis)
  assert {s.data.shape[0] for s in out["labels"].addressable_shards} == {rows_per_shard}
  np.testing.assert_array_equal(np.asarray(out["labels"]), batch["labels"])


def test_batch_not_divisible_by_devices_fails():
  with pytest.raises(ValueError):
    ip.make_global_batch(host_batch(rows=12), jax.make_mesh((8,), ("data",)))
