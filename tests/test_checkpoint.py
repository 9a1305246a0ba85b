"""Checkpointer tests on 8 simulated CPU devices (tests/conftest.py)."""

import gc
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from big_vision_relu.checkpoint import Checkpointer, read_state


# When a read fails, orbax leaves some of its read coroutines un-awaited, and tensorstore may
# later call back into orbax's closed event loop; Python reports both as "unraisable"
# exceptions when the objects are garbage-collected. That is orbax's clean-up noise, not a
# failure of the code under test: ignore it in this module, and collect the garbage before
# each reading test ends so it does not surface in whichever test runs next.
pytestmark = pytest.mark.filterwarnings(
  "ignore::pytest.PytestUnraisableExceptionWarning",
  "ignore:coroutine .* was never awaited:RuntimeWarning",
)


@pytest.fixture
def _collect_orbax_garbage():
  """Request it FIRST: it then tears down last, after caplog has dropped orbax's records."""
  yield
  gc.collect()


def _mesh(shape, names):
  return Mesh(np.array(jax.devices()[:8]).reshape(shape), names)


def _state(seed=0):
  """A train-state-like tree: sharded f32, replicated bf16, typed PRNG key, int step."""
  mesh = _mesh((8,), ("data",))
  rng = np.random.default_rng(seed)
  return {
    "params": {
      "kernel": jax.device_put(
        rng.normal(size=(16, 6)).astype(np.float32), NamedSharding(mesh, P("data"))
      ),
      "bias": jax.device_put(
        jnp.asarray(rng.normal(size=(6,)), jnp.bfloat16), NamedSharding(mesh, P())
      ),
    },
    "opt": {"mu": jnp.asarray(rng.normal(size=(16, 6)), jnp.bfloat16)},
    "rng": jax.random.key(seed),
    "step": jnp.asarray(seed, jnp.int32),
  }


def _target(state, shardings=None):
  shardings = shardings or jax.tree.map(lambda x: x.sharding, state)
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
  )


def _assert_identical(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bit-identical


def _save_steps(directory, steps, **kw):
  kw.setdefault("save_interval_steps", 1)
  with Checkpointer(directory, **kw) as ckpt:
    for s in steps:
      assert ckpt.save(s, _state(s), {"data_position": 10 * s})
    ckpt.wait_until_finished()
    return ckpt.all_steps()


def test_round_trip_bit_identical_with_target_sharding(tmp_path):
  state = _state(3)
  with Checkpointer(tmp_path, save_interval_steps=1) as ckpt:
    assert ckpt.save(5, state, {"data_position": 1234, "core_hours": 0.5})
    ckpt.wait_until_finished()
  # Restore onto a different mesh layout: the result must follow the target's shardings.
  mesh2 = _mesh((4, 2), ("a", "b"))
  shardings = jax.tree.map(lambda _: NamedSharding(mesh2, P()), state)
  shardings["params"]["kernel"] = NamedSharding(mesh2, P("a", "b"))
  with Checkpointer(tmp_path, save_interval_steps=1) as ckpt:
    restored = ckpt.restore_latest(_target(state, shardings))
  assert restored.step == 5
  assert restored.extra == {"data_position": 1234, "core_hours": 0.5}
  _assert_identical(restored.state, state)
  for leaf, sharding in zip(jax.tree.leaves(restored.state), jax.tree.leaves(shardings)):
    assert leaf.sharding == sharding
  kernel = restored.state["params"]["kernel"]
  assert len(kernel.addressable_shards) == 8 and kernel.addressable_shards[0].data.shape == (4, 3)


def test_save_interval_force_and_existing_step(tmp_path):
  with Checkpointer(tmp_path, save_interval_steps=3, keep_last=10) as ckpt:
    saved = [s for s in range(1, 8) if ckpt.save(s, _state(s))]
    assert ckpt.save(7, _state(7), force=True)
    assert not ckpt.save(7, _state(7), force=True)  # already on disk: not rewritten
    ckpt.wait_until_finished()
    assert saved == [3, 6]
    assert ckpt.all_steps() == [3, 6, 7]
    with pytest.raises(ValueError, match="JSON"):
      ckpt.save(9, _state(9), {"bad": object()})


def test_keep_policy(tmp_path):
  # Newest 2, plus multiples of 4 forever.
  assert _save_steps(tmp_path, range(1, 11), keep_last=2, keep_every_steps=4) == [4, 8, 9, 10]
  assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["10", "4", "8", "9"]


def test_keep_last_only(tmp_path):
  assert _save_steps(tmp_path, range(1, 6), keep_last=3) == [3, 4, 5]


def test_no_checkpoint_returns_none(tmp_path):
  with Checkpointer(tmp_path / "new", save_interval_steps=1) as ckpt:
    assert ckpt.restore_latest(_target(_state())) is None


def _truncate_data_files(step_dir):
  files = [p for p in (step_dir / "state" / "d").iterdir() if p.is_file()]
  assert files, f"no OCDBT data files under {step_dir}; did orbax's layout change?"
  for f in files:
    os.truncate(f, f.stat().st_size // 2)


def _delete_extra(step_dir):
  (step_dir / "extra" / "metadata").unlink()


@pytest.mark.parametrize("corrupt", [_truncate_data_files, _delete_extra])
def test_corrupt_newest_falls_back_with_warning(_collect_orbax_garbage, tmp_path, caplog, corrupt):
  assert _save_steps(tmp_path, [1, 2, 3]) == [1, 2, 3]
  corrupt(tmp_path / "3")
  with caplog.at_level(logging.WARNING), Checkpointer(tmp_path, save_interval_steps=1) as ckpt:
    restored = ckpt.restore_latest(_target(_state()))
    assert restored.step == 2 and restored.extra == {"data_position": 20}
    _assert_identical(restored.state, _state(2))
    # The damaged step is moved aside (not deleted), and the good ones are untouched.
    assert ckpt.all_steps() == [1, 2]
    assert len(list(tmp_path.glob("3.corrupt-*"))) == 1
    # Training can save step 3 again.
    assert ckpt.save(3, _state(3))
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [1, 2, 3]
  assert any("step 3" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_all_corrupt_raises_and_moves_nothing(tmp_path, _collect_orbax_garbage):
  _save_steps(tmp_path, [1, 2])
  for step in (1, 2):
    _truncate_data_files(tmp_path / str(step))
  with Checkpointer(tmp_path, save_interval_steps=1) as ckpt:
    with pytest.raises(RuntimeError, match=r"(?s)could be restored.*step 2.*step 1"):
      ckpt.restore_latest(_target(_state()))
    assert ckpt.all_steps() == [1, 2]
  assert not list(tmp_path.glob("*.corrupt-*"))


def test_mismatched_target_is_an_error_not_a_fallback(tmp_path, _collect_orbax_garbage):
  _save_steps(tmp_path, [1, 2])
  target = _target(_state())
  target["params"]["kernel"] = jax.ShapeDtypeStruct((16, 7), jnp.float32)
  with Checkpointer(tmp_path, save_interval_steps=1) as ckpt:
    with pytest.raises(RuntimeError, match="does not match"):
      ckpt.restore_latest(target)
    assert ckpt.all_steps() == [1, 2]  # good checkpoints are never moved
  assert not list(tmp_path.glob("*.corrupt-*"))


def test_read_state_needs_no_target_and_warns_of_nothing(tmp_path, monkeypatch, caplog):
  _save_steps(tmp_path / "checkpoints", [1, 2])
  monkeypatch.chdir(tmp_path)  # a relative step directory, as a user would type it
  device = jax.sharding.SingleDeviceSharding(jax.devices()[1])
  with caplog.at_level(logging.WARNING):
    state = read_state("checkpoints/2", device)
  assert not caplog.records, [r.getMessage() for r in caplog.records]
  _assert_identical(state, _state(2))
  assert {leaf.sharding for leaf in jax.tree.leaves(state)} == {device}


def test_read_state_of_a_damaged_step_raises_and_moves_nothing(_collect_orbax_garbage, tmp_path):
  _save_steps(tmp_path, [1, 2])
  _truncate_data_files(tmp_path / "2")
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  with pytest.raises((ValueError, OSError)):
    read_state(tmp_path / "2", device)
  with pytest.raises(ValueError, match="not a checkpoint step"):
    read_state(tmp_path / "2" / "state", device)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


@pytest.mark.parametrize(
  "kw,match",
  [
    (dict(save_interval_steps=0), "save_interval_steps"),
    (dict(save_interval_steps=1, keep_last=0), "keep_last"),
    (dict(save_interval_steps=1, keep_every_steps=0), "keep_every_steps"),
  ],
)
def test_argument_errors(tmp_path, kw, match):
  with pytest.raises(ValueError, match=match):
    Checkpointer(tmp_path, **kw)


def test_relative_directory_works(tmp_path, monkeypatch):
  """`--workdir runs/x` is common; orbax itself only takes absolute paths."""
  monkeypatch.chdir(tmp_path)
  state = {"x": jnp.arange(4.0)}
  ckpt = Checkpointer("runs/x/checkpoints", save_interval_steps=1, async_save=False)
  assert ckpt.save(1, state, {"core_hours": 0.5})
  ckpt.wait_until_finished()
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        state)
  restored = ckpt.restore_latest(target)
  ckpt.close()
  assert restored.step == 1 and restored.extra == {"core_hours": 0.5}
  np.testing.assert_array_equal(restored.state["x"], state["x"])
  assert (tmp_path / "runs" / "x" / "checkpoints" / "1").is_dir()
