"""The optimizer: big_vision's update rule, assembled from optax transformations.

For a trainable parameter `p` with gradient `g` at update number `t` (0 for the first
update: optax counts the updates already applied), the update added to `p` is::

    g' = g * min(1, grad_clip_norm / ||g_trainable||)     global-norm clip (trainable params only)
    d  = direction(g')                                     optax.<optax_name>(**optax), e.g. Adam
    u  = lr * lr_mult(p) * d  +  wd * wd_mult(p) * p       decoupled weight decay, NOT times lr
    update = -schedule_p(t) * u

so `wd` is an absolute decay rate per step (big_vision's convention: `wd=1e-4` with
`lr=1e-3` equals AdamW's `weight_decay=0.1`), and the schedule scales the decay too.
Frozen parameters (a schedule rule of `None`) get an update of exactly zero and keep no
optimizer state (their Adam moments are `optax.MaskedNode`).

Config keys read (from the trainer's filled config, or one filled with
`config.OPTIMIZER_SCHEMA`, which holds their defaults and checks; other keys are ignored):

- `optax_name`: `'scale_by_adam'` or `'trace'` (SGD with momentum).
- `optax`: keyword arguments of that optax function, e.g. `dict(b1=0.9, b2=0.999,
  mu_dtype='bfloat16')`; dtype arguments may be strings. Unknown keys raise.
- `lr`, `wd`.
- `wd_mults`: `[(regex, mult), ...]` (by default kernels only). Parameters matching no
  rule get no weight decay.
- `lr_mults`: `[(regex, mult), ...]`. Parameters matching no rule get 1.
- `grad_clip_norm`: global-norm clip; `None` or 0 disables it.
- `schedule`: one schedule dict (see `make_schedule`) for all parameters, or a list
  `[(regex, schedule_dict_or_None), ...]`; `None` freezes the matching parameters.
  Every parameter must match a rule (end the list with `('.*', ...)`).

With `mu_dtype='bfloat16'` optax computes `b1 * mu` in bfloat16, so the carried moment
is decayed by bfloat16(b1) (0.8984375 for 0.9), not b1; big_vision, on the same optax code,
does the same (tests/test_optim.py pins this down).

Rules match the '/'-joined parameter path (e.g.
`'Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel'`) with `re.fullmatch`, and the
FIRST matching rule of a list applies, so put specific patterns before general ones.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging

from big_vision_relu import config as cfg_lib

Schedule = Callable[[jax.typing.ArrayLike], jax.Array]

# The "direction" transformations selectable by `optax_name`; all other steps of the chain
# (clip, lr, wd, schedule, sign) are fixed by big_vision's semantics.
OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
  "scale_by_adam": optax.scale_by_adam,
  "trace": optax.trace,
}


def _as_dict(value: Any, name: str) -> dict[str, Any]:
  """A plain dict from a dict or ConfigDict; anything else is a config error."""
  if isinstance(value, ml_collections.ConfigDict):
    return value.to_dict()
  if isinstance(value, Mapping):
    return dict(value)
  raise ValueError(f"config.{name} must be a dict, got {type(value).__name__}: {value!r}")


def _reject_unknown(given: Mapping[str, Any], valid: Sequence[str], name: str) -> None:
  unknown = sorted(set(given) - set(valid))
  if unknown:
    raise ValueError(f"config.{name} has unknown keys {unknown}; valid keys: {sorted(valid)}")


def _warmup_steps(cfg: Mapping[str, Any], total_steps: int) -> int:
  if "warmup_percent" in cfg:  # a fraction of the run (big_vision's "_percent"), not 0-100
    return int(cfg["warmup_percent"] * total_steps)
  if "warmup_steps" in cfg:
    return int(cfg["warmup_steps"])
  return 0  # no warmup


def make_schedule(schedule_cfg: Mapping[str, Any], total_steps: int) -> Schedule:
  """Learning-rate multiplier `t -> [0, mult]`: linear warmup from 0, then a decay.

  Keys (defaults: `config.SCHEDULE_DEFAULTS`, `config.DECAY_TYPE_DEFAULTS`): `decay_type`
  (`'cosine'`, `'linear'`, `'rsqrt'`); `warmup_steps` or `warmup_percent` (fraction of
  `total_steps`; neither: no warmup); `mult` (scales the whole schedule); per decay type: `min`
  (cosine: value reached at `total_steps`), `linear_end` (linear: value reached at
  `total_steps`), `timescale` (rsqrt: `sqrt(timescale / (t - warmup + timescale))` after
  warmup; it does not reach 0).

  The value at step `t` is `t / warmup` during warmup, exactly `mult` at
  `t = warmup`, and the decay spans the remaining `total_steps - warmup` steps (cosine:
  `mult / 2` at their midpoint). Steps past `total_steps` keep the final value.
  """
  if int(total_steps) != total_steps or total_steps <= 0:
    raise ValueError(f"total_steps={total_steps!r} must be a positive integer")
  cfg = cfg_lib.fill_schedule(schedule_cfg, total_steps)
  decay_type = cfg["decay_type"]
  warmup = _warmup_steps(cfg, total_steps)
  decay_steps = total_steps - warmup

  if decay_type == "cosine":
    decay = optax.cosine_decay_schedule(1.0, decay_steps, alpha=float(cfg["min"]))
  elif decay_type == "linear":
    decay = optax.linear_schedule(1.0, float(cfg["linear_end"]), decay_steps)
  else:  # rsqrt: optax has no inverse-square-root schedule.
    timescale = float(cfg["timescale"])

    def decay(t: jax.typing.ArrayLike) -> jax.Array:
      return jnp.sqrt(timescale / (t + timescale))

  if warmup:
    # join_schedules hands the decay `t - warmup`, so the decay starts at 1 = the peak.
    base = optax.join_schedules([optax.linear_schedule(0.0, 1.0, warmup), decay], [warmup])
  else:
    base = decay
  mult = float(cfg["mult"])

  def schedule(step: jax.typing.ArrayLike) -> jax.Array:
    # A float step (the default float dtype: float32, or float64 under jax_enable_x64):
    # optax's int32 counter would otherwise pin the maths to float32 even in float64 runs.
    return mult * base(jnp.asarray(step, dtype=jnp.result_type(float)))

  return schedule


def param_paths(params: Any) -> Any:
  """The tree of '/'-joined parameter paths, e.g. `'head/kernel'`, shaped like `params`."""
  return jax.tree_util.tree_map_with_path(
    lambda path, _: jax.tree_util.keystr(path, simple=True, separator="/"), params
  )


def _rule_list(rules: Any, name: str) -> list[tuple[str, Any]]:
  """Validates `[(regex, value), ...]`: pairs with a string regex that compiles."""
  if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
    raise ValueError(f"config.{name} must be a list of (regex, value) pairs, got {rules!r}")
  out = []
  for rule in rules:
    if not (isinstance(rule, Sequence) and len(rule) == 2 and isinstance(rule[0], str)):
      raise ValueError(f"config.{name}: each rule must be a (regex, value) pair, got {rule!r}")
    try:
      re.compile(rule[0])
    except re.error as e:
      raise ValueError(f"config.{name}: invalid regex {rule[0]!r}: {e}") from e
    out.append((rule[0], rule[1]))
  return out


def _assign(paths: list[str], patterns: Sequence[str], name: str) -> dict[str, int | None]:
  """Index of the first pattern fully matching each path (None: no match)."""
  assignment: dict[str, int | None] = {}
  for path in paths:
    assignment[path] = next(
      (i for i, pattern in enumerate(patterns) if re.fullmatch(pattern, path)), None
    )
  used = {i for i in assignment.values() if i is not None}
  for i, pattern in enumerate(patterns):
    if i not in used:
      # Not an error: generic configs name params some models lack. Still say so, since a
      # typo in a regex would otherwise silently do nothing.
      logging.warning("config.%s rule %r matches no parameter", name, pattern)
  return assignment


def _masks(paths_tree: Any, assignment: Mapping[str, int | None], n: int) -> list[Any]:
  """One boolean tree per rule: True where that rule is the first match."""
  return [jax.tree.map(lambda p, i=i: assignment[p] == i, paths_tree) for i in range(n)]


def _direction(config: Any) -> optax.GradientTransformation:
  """The optax transformation named by `config.optax_name`, with `config.optax` kwargs."""
  name = config.optax_name
  if name not in OPTIMIZERS:
    raise ValueError(f"config.optax_name={name!r} is unknown; valid: {sorted(OPTIMIZERS)}")
  fn = OPTIMIZERS[name]
  kwargs = _as_dict(config.optax, "optax")
  _reject_unknown(kwargs, list(inspect.signature(fn).parameters), "optax")
  for key, value in kwargs.items():
    # Configs write dtypes as strings ('bfloat16'); optax wants a dtype.
    if key.endswith("_dtype") and isinstance(value, str):
      try:
        kwargs[key] = jnp.dtype(value)
      except TypeError as e:
        raise ValueError(f"config.optax.{key}={value!r} is not a dtype name") from e
  return fn(**kwargs)


def make_optimizer(
  config: ml_collections.ConfigDict | Mapping[str, Any],
  params: Any,
  total_steps: int,
) -> tuple[optax.GradientTransformation, dict[str, Schedule]]:
  """Builds the optimizer described in the module docstring.

  Args:
    config: the filled training config (see the module docstring for the keys read).
    params: the parameter tree, real or abstract (`jax.ShapeDtypeStruct` leaves); only its
      structure and paths are used. `init`/`update` must get trees of this structure.
    total_steps: length of the run, for the schedules.

  Returns:
    `(tx, schedules)`: the optax transformation, and `{regex: schedule}` for every
    non-frozen schedule rule (`{'.*': schedule}` for a single schedule dict), in config
    order. `schedule(t)` is the multiplier of update `t`; the step size is
    `lr * schedule(t)`, the decay rate `wd * schedule(t)`. Log it on the host.
  """
  lr, wd, clip = float(config.lr), float(config.wd), config.grad_clip_norm

  paths_tree = param_paths(params)
  paths = jax.tree.leaves(paths_tree)

  schedule_cfg = config.schedule
  if isinstance(schedule_cfg, (Mapping, ml_collections.ConfigDict)):
    schedule_rules = [(".*", schedule_cfg)]
  else:
    schedule_rules = _rule_list(schedule_cfg, "schedule")
  patterns = [pattern for pattern, _ in schedule_rules]
  groups = _assign(paths, patterns, "schedule")
  unmatched = [p for p, i in groups.items() if i is None]
  if unmatched:
    raise ValueError(
      f"config.schedule: {len(unmatched)} parameters match no rule, e.g. {unmatched[:5]}; "
      "add a final catch-all rule ('.*', schedule_dict) or ('.*', None) to freeze them"
    )
  group_masks = _masks(paths_tree, groups, len(schedule_rules))
  frozen_ids = {i for i, (_, cfg) in enumerate(schedule_rules) if cfg is None}
  trainable = jax.tree.map(lambda p: groups[p] not in frozen_ids, paths_tree)

  txs = []
  if clip:
    # Inside the trainable mask, so frozen gradients do not count in the global norm.
    txs.append(optax.masked(optax.clip_by_global_norm(float(clip)), trainable))
  txs.append(optax.masked(_direction(config), trainable))
  txs.append(optax.scale(lr))
  lr_rules = _rule_list(config.lr_mults, "lr_mults")
  lr_masks = _masks(paths_tree, _assign(paths, [r for r, _ in lr_rules], "lr_mults"), len(lr_rules))
  txs += [optax.masked(optax.scale(float(m)), mask) for (_, m), mask in zip(lr_rules, lr_masks)]
  if wd:
    wd_rules = _rule_list(config.wd_mults, "wd_mults")
    wd_masks = _masks(
      paths_tree, _assign(paths, [r for r, _ in wd_rules], "wd_mults"), len(wd_rules)
    )
    txs += [
      optax.masked(optax.add_decayed_weights(wd * float(m)), mask)
      for (_, m), mask in zip(wd_rules, wd_masks)
    ]
  schedules: dict[str, Schedule] = {}
  for i, (pattern, cfg) in enumerate(schedule_rules):
    if cfg is None:
      continue
    schedules[pattern] = make_schedule(cfg, total_steps)
    txs.append(optax.masked(optax.scale_by_schedule(schedules[pattern]), group_masks[i]))
  if frozen_ids:
    frozen = jax.tree.map(lambda t: not t, trainable)
    txs.append(optax.masked(optax.set_to_zero(), frozen))
  txs.append(optax.scale(-1.0))
  return optax.chain(*txs), schedules
