"""Optimizer tests: optax chain vs an independent float64 NumPy re-implementation.

The chain runs in float64 (``jax.enable_x64``) so the comparison checks the maths to ~1e-10;
one test also runs it in float32, where optax's ``1 - b2**t`` bias correction loses digits
to cancellation (~5e-5 relative at t=2), hence its looser tolerance.
"""

import math

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
import optax
import pytest

from big_vision_relu import config as cfg_lib
from big_vision_relu import optim

SHAPES = {
  "Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel": (3, 4),
  "Transformer/encoderblock_0/MlpBlock_0/Dense_0/bias": (4,),
  "pos_embedding": (1, 3, 4),
  "head/kernel": (4, 2),
  "head/bias": (2,),
}


def _nest(flat):
  """{'a/b': x} -> {'a': {'b': x}} (the flax param tree layout)."""
  tree = {}
  for path, value in flat.items():
    *parents, leaf = path.split("/")
    node = tree
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = value
  return tree


def _flat(tree):
  paths = jax.tree.leaves(optim.param_paths(tree))
  return dict(zip(paths, jax.tree.leaves(tree)))


def _params(seed=0):
  rng = np.random.default_rng(seed)
  return {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}


def _grads(n, seed=1):
  rng = np.random.default_rng(seed)
  return [
    {k: (2 * rng.normal(size=s)).astype(np.float32) for k, s in SHAPES.items()} for _ in range(n)
  ]


def _config(**overrides):
  cfg = dict(
    optax_name="scale_by_adam",
    optax=dict(b1=0.9, b2=0.999, eps=1e-8),
    lr=0.1,
    wd=0.05,
    grad_clip_norm=1.0,
    schedule=dict(warmup_steps=3, decay_type="cosine"),
  )
  cfg.update(overrides)  # Before ConfigDict: it refuses to change a field's type.
  return cfg_lib.fill_defaults(ml_collections.ConfigDict(cfg), cfg_lib.OPTIMIZER_SCHEMA)


def _run(cfg, params_flat, grads_seq, total_steps, x64=True):
  """Applies the optax chain (jitted) for len(grads_seq) updates; returns flat params, state."""
  dtype = np.float64 if x64 else np.float32
  with jax.enable_x64(x64):
    params = _nest({k: jnp.asarray(v, dtype) for k, v in params_flat.items()})
    tx, _ = optim.make_optimizer(cfg, params, total_steps)
    state = tx.init(params)

    @jax.jit
    def step(params, state, grads):
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    for g in grads_seq:
      grads = _nest({k: jnp.asarray(v, dtype) for k, v in g.items()})
      params, state = step(params, state, grads)
    assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype(dtype)}
    return {k: np.asarray(v) for k, v in _flat(params).items()}, state


def _np_schedule(t, warmup, total, kind="cosine", end=0.0, timescale=10_000.0, mult=1.0):
  """Closed form of the schedule multiplier, written independently of optax."""
  if t < warmup:
    return mult * t / warmup
  if kind == "rsqrt":
    return mult * math.sqrt(timescale / (t - warmup + timescale))
  p = min((t - warmup) / (total - warmup), 1.0)
  if kind == "cosine":
    return mult * (end + (1 - end) * 0.5 * (1 + math.cos(math.pi * p)))
  return mult * (1.0 + (end - 1.0) * p)


def _bf16(x):
  """Round to bfloat16 (round-to-nearest-even), back in float64."""
  return np.asarray(x, np.float64).astype(ml_dtypes.bfloat16).astype(np.float64)


def _kernel_only(path):
  return 1.0 if path.endswith("/kernel") else 0.0


def _np_reference(
  params, grads_seq, *, total, lr=0.1, wd=0.05, clip=1.0, b1=0.9, b2=0.999, eps=1e-8, warmup=3,
  wd_mult=_kernel_only, lr_mult=lambda path: 1.0, mu_bf16=False
):
  """Float64 big_vision update: clip -> adam -> x lr*lr_mult -> + wd*mult*p -> x sched -> x -1.

  The defaults are `_config()`'s hyper-parameters.
  """
  p = {k: v.astype(np.float64) for k, v in params.items()}
  mu = {k: np.zeros_like(v) for k, v in p.items()}
  nu = {k: np.zeros_like(v) for k, v in p.items()}
  for t, g in enumerate(grads_seq):
    g = {k: v.astype(np.float64) for k, v in g.items()}
    norm = math.sqrt(sum(float(np.sum(v * v)) for v in g.values()))
    if clip and norm > clip:
      g = {k: v * clip / norm for k, v in g.items()}
    s = _np_schedule(t, warmup, total)
    for k in p:
      if mu_bf16:
        # optax computes `b1 * mu` in mu's dtype: the python float b1 is weakly typed,
        # so it is itself rounded to bfloat16 (0.9 -> 0.8984375) and so is the product.
        carried = _bf16(_bf16(b1) * mu[k])
      else:
        carried = b1 * mu[k]
      mu[k] = carried + (1 - b1) * g[k]
      nu[k] = b2 * nu[k] + (1 - b2) * g[k] ** 2
      mu_hat = mu[k] / (1 - b1 ** (t + 1))
      nu_hat = nu[k] / (1 - b2 ** (t + 1))
      direction = mu_hat / (np.sqrt(nu_hat) + eps)
      if mu_bf16:  # optax uses the fresh moment, then stores it in the state's dtype.
        mu[k] = _bf16(mu[k])
      u = lr * lr_mult(k) * direction + wd * wd_mult(k) * p[k]
      p[k] = p[k] - s * u
  return p


@pytest.mark.parametrize("x64,tol", [(True, 1e-10), (False, 1e-5)])
def test_chain_matches_numpy_reference(x64, tol):
  params, grads = _params(), _grads(6)
  cfg = _config(lr_mults=[("head/.*", 0.5)])
  got, _ = _run(cfg, params, grads, total_steps=8, x64=x64)
  want = _np_reference(params, grads, total=8,
                       lr_mult=lambda k: 0.5 if k.startswith("head/") else 1.0)
  # The grads have norm ~ 2*sqrt(47) > 1, so the clip is active at every step.
  assert math.sqrt(sum(float(np.sum(v**2)) for v in grads[0].values())) > 1.0
  for k in SHAPES:
    np.testing.assert_allclose(got[k], want[k], rtol=tol, atol=tol, err_msg=k)
    assert not np.allclose(got[k], params[k], atol=1e-3), f"{k} did not move"


def test_weight_decay_is_not_scaled_by_lr_and_only_on_kernels():
  # Zero gradients: Adam's direction is exactly 0, so the update is pure weight decay.
  params = _params()
  zeros = [{k: np.zeros(s, np.float32) for k, s in SHAPES.items()}] * 4
  cfg = _config(lr=123.0, wd=0.01, schedule=dict(warmup_steps=0, decay_type="cosine"))
  got, _ = _run(cfg, params, zeros, total_steps=4)
  for k, v in params.items():
    want = v.astype(np.float64)
    for t in range(4):
      want = want - _np_schedule(t, 0, 4) * 0.01 * _kernel_only(k) * want
    np.testing.assert_allclose(got[k], want, rtol=1e-12, err_msg=k)
    if not k.endswith("/kernel"):
      np.testing.assert_array_equal(got[k], v)


def test_wd_mults_first_match_wins_and_empty_list_disables_decay():
  params = _params()
  zeros = [{k: np.zeros(s, np.float32) for k, s in SHAPES.items()}]
  sched = dict(warmup_steps=0, decay_type="linear", linear_end=1.0)  # constant 1
  cfg = _config(
    wd=0.1,
    schedule=sched,
    wd_mults=[("head/kernel", 2.0), (".*/kernel", 1.0), ("pos_embedding", 0.5)],
  )
  got, _ = _run(cfg, params, zeros, total_steps=4)
  expected_mult = {
    "head/kernel": 2.0,
    "pos_embedding": 0.5,
    "head/bias": 0.0,
    "Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel": 1.0,
    "Transformer/encoderblock_0/MlpBlock_0/Dense_0/bias": 0.0,
  }
  for k, v in params.items():
    want = v.astype(np.float64) * (1 - 0.1 * expected_mult[k])
    np.testing.assert_allclose(got[k], want, rtol=1e-12, err_msg=k)
  got, _ = _run(_config(wd=0.1, schedule=sched, wd_mults=[]), params, zeros, total_steps=4)
  for k, v in params.items():
    np.testing.assert_array_equal(got[k], v)


def test_mu_dtype_bfloat16_is_honoured():
  params, grads = _params(), _grads(4)
  cfg = _config(optax=dict(mu_dtype="bfloat16"))
  got, state = _run(cfg, params, grads, total_steps=8)
  adam = next(
    s
    for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
    if isinstance(s, optax.ScaleByAdamState)
  )
  assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype(jnp.float64)}
  want_bf16 = _np_reference(params, grads, total=8, mu_bf16=True)
  want_f32 = _np_reference(params, grads, total=8, mu_bf16=False)
  for k in SHAPES:
    np.testing.assert_allclose(got[k], want_bf16[k], rtol=1e-10, atol=1e-10, err_msg=k)
  # ... and the bf16 rounding is visible, so the check above can tell the two apart.
  assert max(np.max(np.abs(got[k] - want_f32[k])) for k in SHAPES) > 1e-4


def test_sgd_momentum_trace():
  params, grads = _params(), _grads(3)
  cfg = _config(
    optax_name="trace",
    optax=dict(decay=0.9),
    wd=0.0,
    grad_clip_norm=None,
    schedule=dict(warmup_steps=0, decay_type="linear", linear_end=1.0),
  )
  got, _ = _run(cfg, params, grads, total_steps=10)
  for k in SHAPES:
    p, m = params[k].astype(np.float64), 0.0
    for g in grads:
      m = 0.9 * m + g[k].astype(np.float64)
      p = p - 0.1 * m
    np.testing.assert_allclose(got[k], p, rtol=1e-10, atol=1e-10, err_msg=k)


@pytest.mark.parametrize(
  "kind,extra",
  [
    ("cosine", {}),
    ("cosine", {"min": 0.1}),
    ("linear", {}),
    ("linear", {"linear_end": 0.2}),
    ("rsqrt", {"timescale": 50}),
  ],
)
def test_schedule_closed_forms(kind, extra):
  total, warmup = 1000, 100
  fn = optim.make_schedule(dict(warmup_steps=warmup, decay_type=kind, **extra), total)
  end = extra.get("min", extra.get("linear_end", 0.0))
  for t in [0, 1, 50, 99, 100, 101, 550, 999, 1000, 5000]:
    want = _np_schedule(t, warmup, total, kind, end=end, timescale=extra.get("timescale", 0))
    np.testing.assert_allclose(float(fn(t)), want, rtol=1e-5, atol=1e-7, err_msg=str(t))
  assert float(fn(0)) == 0.0 and float(fn(warmup)) == pytest.approx(1.0)
  if kind == "cosine":
    assert float(fn(550)) == pytest.approx(0.5 + end / 2)  # midpoint of the decay
  if kind != "rsqrt":
    assert float(fn(total)) == pytest.approx(end, abs=1e-7)


def test_schedule_warmup_percent_and_mult():
  fn = optim.make_schedule(dict(warmup_percent=0.1, mult=2.0), 500)
  assert float(fn(25)) == pytest.approx(1.0)  # 2 * 25/50
  assert float(fn(50)) == pytest.approx(2.0)
  assert float(fn(275)) == pytest.approx(1.0)
  assert float(fn(500)) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("given", [{}, {"decay_type": "linear", "warmup_steps": 10},
                                   {"decay_type": "rsqrt", "warmup_percent": 0.1}])
def test_a_schedule_runs_its_filled_dict(given):
  """The schema's defaults are what runs: the dict as given and the dict `fill_schedule` makes
  of it give the same schedule, and filling leaves only keys valid for the decay type."""
  filled = cfg_lib.fill_schedule(given, 100)
  assert given.items() <= filled.items()
  assert cfg_lib.fill_schedule(filled, 100) == filled
  as_given, as_filled = optim.make_schedule(given, 100), optim.make_schedule(filled, 100)
  for t in [0, 5, 10, 50, 99, 100]:
    assert float(as_given(t)) == float(as_filled(t))
  with pytest.raises(ValueError, match="unknown keys"):
    cfg_lib.fill_schedule({"decay_type": "cosine", "timescale": 5}, 100)


def test_make_optimizer_returns_the_schedules():
  params = _nest(_params())
  _, schedules = optim.make_optimizer(_config(), params, 8)
  assert list(schedules) == [".*"]
  assert float(schedules[".*"](3)) == pytest.approx(1.0)
  cfg = _config(schedule=[("head/.*", dict(warmup_steps=2)), (".*", None)])
  _, schedules = optim.make_optimizer(cfg, params, 8)
  assert list(schedules) == ["head/.*"]


def test_frozen_params_unchanged_and_stateless():
  params, grads = _params(), _grads(3)
  cfg = _config(schedule=[("head/.*", dict(warmup_steps=1, decay_type="cosine")), (".*", None)])
  got, state = _run(cfg, params, grads, total_steps=10)
  for k, v in params.items():
    if k.startswith("head/"):
      assert not np.allclose(got[k], v, atol=1e-4), k
    else:
      np.testing.assert_array_equal(got[k], v)  # exactly: the update is 0
  # Frozen params carry no optimizer state: only head's Adam moments (+ scalar counters).
  head_size = sum(math.prod(SHAPES[k]) for k in ("head/kernel", "head/bias"))
  state_size = sum(x.size for x in jax.tree.leaves(state))
  assert 2 * head_size <= state_size <= 2 * head_size + 10
  # Trainable-only: the frozen grads do not enter the clip's global norm.
  want = _np_reference(
    {k: v for k, v in params.items() if k.startswith("head/")},
    [{k: v for k, v in g.items() if k.startswith("head/")} for g in grads],
    warmup=1,
    total=10,
  )
  for k in ("head/kernel", "head/bias"):
    np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-10, err_msg=k)


def test_abstract_params_are_enough():
  params = _nest(_params())
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  tx, _ = optim.make_optimizer(_config(), abstract, 8)
  state = jax.eval_shape(tx.init, abstract)
  assert jax.tree.structure(state) == jax.tree.structure(tx.init(params))


@pytest.mark.parametrize(
  "overrides,match",
  [
    (dict(optax=dict(b1=0.9, beta2=0.99)), r"unknown keys \['beta2'\].*'b2'.*'mu_dtype'"),
    (dict(optax_name="adamw"), r"optax_name='adamw'.*scale_by_adam"),
    (dict(optax=dict(mu_dtype="bfloat17")), r"mu_dtype='bfloat17'"),
    (
      dict(schedule=dict(warmup_steps=3, decay="cosine")),
      r"unknown keys \['decay'\].*'decay_type'.*'warmup_steps'",
    ),
    (dict(schedule=dict(decay_type="linear", min=0.1)), r"unknown keys \['min'\].*'linear_end'"),
    (dict(schedule=dict(decay_type="exp")), r"'exp' is unknown.*cosine.*linear.*rsqrt"),
    (dict(schedule=dict(warmup_steps=3, warmup_percent=0.1)), "not both"),
    (dict(schedule=dict(warmup_percent=10)), "fraction"),
    (dict(schedule=dict(warmup_steps=8)), "shorter than the run"),
    (dict(schedule=[("head/.*", dict())]), r"match no rule.*Transformer.*catch-all"),
    (dict(schedule=None), "config.schedule is required"),
    (dict(lr=None), "config.lr is required"),
    (dict(grad_clip_norm=-1.0), "grad_clip_norm"),
    (dict(wd_mults=[(".*/kernel",)]), r"\(regex, value\) pair"),
    (dict(lr_mults=[("head/(", 2.0)]), "invalid regex"),
  ],
)
def test_config_errors(overrides, match):
  with pytest.raises(ValueError, match=match):  # from the schema's checks or from optim's
    optim.make_optimizer(_config(**overrides), _nest(_params()), 8)
