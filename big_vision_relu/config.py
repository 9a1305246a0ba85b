"""Config helpers: `file.py:key=value` arguments, optional fields, duration keys, the schema.

Configs are ml_collections ConfigDicts built by `get_config(arg)` in a python file; the trainer
validates them here before anything compiles, so a typo fails in a second, not after an hour.
A field whose value is None means "unset" everywhere (the same as a missing key).
`TRAIN_SCHEMA` is the one list of a training config's keys, each with its default and its
check; `validate_train_config` returns the config the trainer runs: every key filled in.
Each evaluator's `CONFIG_SCHEMA` is built from the same `Key`s and checks.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ml_collections
from ml_collections import config_dict

from big_vision_relu import losses
from big_vision_relu.data import holdout

DURATION_UNITS = ("steps", "epochs", "examples", "percent")
TOTAL_KEYS = ("total_steps", "total_epochs", "total_examples")  # the run's length: one of them
DATA_AXIS = "data"  # the mesh axis the batch is split over: config.mesh must have it
DECAY_TYPES = ("cosine", "linear", "rsqrt")
# A schedule dict's defaults (optim.make_schedule's keys): the common ones, then each decay
# type's own (valid only with that type). A warmup is warmup_steps or warmup_percent (a
# fraction of the run); neither: none.
SCHEDULE_DEFAULTS = {"decay_type": "cosine", "mult": 1.0}
DECAY_TYPE_DEFAULTS = {"cosine": {"min": 0.0}, "linear": {"linear_end": 0.0},
                       "rsqrt": {"timescale": 10_000}}
_SCHEDULE_KEYS = (*SCHEDULE_DEFAULTS, "warmup_steps", "warmup_percent")


def optional(value: Any = None) -> config_dict.FieldReference:
  """An optional config field, settable with `--config.key=VALUE` and clearable with
  `--config.key=None`.

  ml_collections cannot override a field holding None, and a typed placeholder
  (`placeholder(int)`) cannot be set back to None on the command line, which is how one switches
  e.g. from total_epochs to total_steps. A placeholder of type `object` takes any Python literal;
  validate_train_config checks the value instead.
  """
  return config_dict.FieldReference(value, field_type=object)


def without_unset(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` without its None-valued fields (unset placeholders), at every level,
  so that they read as missing keys (and take their defaults)."""
  copy = config.copy_and_resolve_references()

  def prune(node: ml_collections.ConfigDict) -> None:
    for key, value in list(node.items()):
      if value is None:
        del node[key]
      elif isinstance(value, ml_collections.ConfigDict):
        prune(value)

  with copy.unlocked():
    prune(copy)
  return copy


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any],
                   prefix: str = "") -> list[tuple[str, Any, Any]]:
  """Every leaf that differs between two configs in JSON form (nested dicts), as
  `(dotted.key, old, new)` in key order. A missing key equals None (an unset placeholder), so a
  config gaining an optional field does not differ from its workdir's config.json."""
  changes = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
      changes += config_changes(a, b, f"{prefix}{key}.")
    elif a != b and not (_is_empty(a) and _is_empty(b)):
      changes.append((f"{prefix}{key}", a, b))
  return changes


def _is_empty(value: Any) -> bool:
  """None, or a dict of nothing but None values (an unset sub-config)."""
  return value is None or (isinstance(value, Mapping) and all(map(_is_empty, value.values())))


def format_changes(changes: Iterable[tuple[str, Any, Any]]) -> str:
  """One line per change: `  key: old -> new` (values as JSON; None shown as unset)."""
  return "\n".join(f"  {key}: {_show(a)} -> {_show(b)}" for key, a, b in changes)


def _show(value: Any) -> str:
  return "unset" if value is None else json.dumps(value)


def _parse_value(text: str, default: Any) -> Any:
  """Parses `text` into the type of `default` (bool, int, float or str)."""
  if isinstance(default, bool):
    if text.lower() in ("", "true", "1", "yes"):
      return True
    if text.lower() in ("false", "0", "no"):
      return False
    raise ValueError(f"Expected a boolean, got {text!r}.")
  if isinstance(default, int):
    return int(text)
  if isinstance(default, float):
    return float(text)
  return text


def parse_arg(arg: str | None, **spec: Any) -> ml_collections.ConfigDict:
  """Parses a config argument like 'variant=B/16,runlocal' against defaults in `spec`.

  A bare boolean name sets it to True ('runlocal'); any other bare first value goes to the
  first key ('B/16' -> variant='B/16'). Values take the type of their default. Unknown keys
  raise ValueError.
  """
  values = dict(spec)
  if arg:
    names = list(spec)
    for i, item in enumerate(arg.split(",")):
      key, eq, text = item.partition("=")
      if not eq:
        if isinstance(spec.get(item.strip()), bool):  # a bare boolean name: 'runlocal'
          key, text = item, ""
        elif i == 0 and names:
          key, text = names[0], item
        else:
          raise ValueError(f"Config argument {item!r} needs a value: {item}=...")
      key = key.strip()
      if key not in spec:
        raise ValueError(f"Unknown config argument {key!r}; valid: {', '.join(names)}.")
      values[key] = _parse_value(text.strip(), spec[key])
  return ml_collections.ConfigDict(values)


def duration_keys(prefix: str) -> tuple[str, ...]:
  return tuple(f"{prefix}_{unit}" for unit in DURATION_UNITS)


def get_steps(config: Mapping[str, Any], prefix: str, *, total_steps: int | None,
              steps_per_epoch: float | None, batch_size: int, required: bool = False,
              where: str = "config") -> int | None:
  """Resolves `{prefix}_steps|_epochs|_examples|_percent` in `config` (named `where` in
  errors, e.g. 'evals.test') to a number of steps.

  At most one of the four may be set; `_percent` is a fraction of `total_steps` in [0, 1]
  (big_vision's convention: 0.1 is 10%). Returns None when none is
  set and not `required`.
  """
  given = {k: config[k] for k in duration_keys(prefix) if config.get(k) is not None}
  if len(given) > 1:
    raise ValueError(f"Contradictory durations in {where}: set only one of "
                     f"{', '.join(given)}.")
  if not given:
    if required:
      raise ValueError(f"Set one of {', '.join(duration_keys(prefix))} in {where}.")
    return None
  (key, value), = given.items()
  name = f"{where}.{key}"
  unit = key[len(prefix) + 1:]
  if unit == "steps":
    steps = value
  elif unit == "examples":
    steps = value / batch_size
  elif unit == "epochs":
    if steps_per_epoch is None:
      raise ValueError(f"{name} needs the dataset size, which is unknown here.")
    steps = value * steps_per_epoch
  else:
    if total_steps is None:
      raise ValueError(f"{name} is relative to the total steps, which are unknown here.")
    if not 0 < value <= 1:
      raise ValueError(f"{name}={value!r} must be a fraction in (0, 1] (0.1 = 10% of the run).")
    steps = value * total_steps
  if not (isinstance(steps, (int, float)) and math.isfinite(steps) and steps > 0):
    raise ValueError(f"{name}={value!r} must be a positive number.")
  return max(1, math.ceil(steps - 1e-9))


def check_keys(where: str, config: Mapping[str, Any], allowed: Iterable[str]) -> None:
  """Raises ValueError naming unknown keys in `config` (a typo would otherwise be ignored)."""
  allowed = set(allowed)
  unknown = sorted(set(config) - allowed)
  if unknown:
    raise ValueError(f"Unknown key(s) in {where}: {', '.join(unknown)}. Valid keys: "
                     f"{', '.join(sorted(allowed))}.")


def _as_mapping(value: Any, where: str) -> Mapping[str, Any]:
  if isinstance(value, ml_collections.ConfigDict):
    return value.to_dict()
  if isinstance(value, Mapping):
    return value
  raise ValueError(f"{where} must be a dict, got {type(value).__name__}: {value!r}")


# ------------------------------------------------------------------ the schema

Check = Callable[[str, Any], None]


@dataclasses.dataclass(frozen=True)
class Key:
  """One key of a schema: its `default` when unset (missing or None) and its `check`.

  `check(where, value)` gets the dotted name ('config.lr') and the filled value, None included,
  and raises ValueError saying what to set: a check that refuses None makes the key required.
  Without a check the key takes any value, or the code using it checks it (noted at the key).
  """
  default: Any = None
  check: Check | None = None


Schema = Mapping[str, Any]  # key -> its Key, or the Schema of a sub-config (filled alike)


def check_that(requirement: str, test: Callable[[Any], bool], *, required: bool = False
               ) -> Check:
  """Checks that a set value passes `test` (else '`where`=value must be `requirement`');
  an unset one (None) fails only when `required`."""
  def check(where: str, value: Any) -> None:
    if value is None:
      if required:
        raise ValueError(f"{where} is required: {requirement}.")
    elif not test(value):
      raise ValueError(f"{where}={value!r} must be {requirement}.")
  return check


def one_of(options: Iterable[str]) -> Check:
  """Checks that the value (None included) is one of `options`."""
  options = tuple(options)

  def check(where: str, value: Any) -> None:
    if value not in options:
      raise ValueError(f"Unknown {where.removeprefix('config.')} {value!r}; valid: "
                       f"{', '.join(options)}.")
  return check


def is_number(value: Any) -> bool:
  """A finite int or float (not a bool)."""
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def is_positive_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


_duration = Key(None, check_that("a positive number", lambda v: is_number(v) and v > 0))


def duration_schema(prefix: str) -> Schema:
  """The keys `{prefix}_steps|_epochs|_examples|_percent`, each an optional positive number;
  `get_steps` checks that at most one is set and resolves it."""
  return {key: _duration for key in duration_keys(prefix)}


def _check_mults(where: str, rules: Any) -> None:
  """The multipliers of `[(regex, mult), ...]`; the rules' structure is optim's to check."""
  for rule in rules if isinstance(rules, (list, tuple)) else ():
    if isinstance(rule, (list, tuple)) and len(rule) == 2 and not (
        is_number(rule[1]) and rule[1] >= 0):
      raise ValueError(f"{where}: the multiplier of {rule[0]!r} is {rule[1]!r}; it must be a "
                       "finite number >= 0 (0 turns it off for those params).")


def _check_schedule_key(where: str, schedule: Any) -> None:
  if schedule is None:
    raise ValueError(f"{where} is required, e.g. dict(warmup_steps=10_000, "
                     "decay_type='cosine').")
  check_schedules(schedule, where=where)


def _check_mesh(where: str, mesh: Any) -> None:
  """A data axis for the batch; the rest of the spec is sharding.make_mesh's to check."""
  if not any(isinstance(axis, (list, tuple)) and axis and axis[0] == DATA_AXIS
             for axis in mesh):
    raise ValueError(f"{where} needs a {DATA_AXIS!r} axis for the batch; got {mesh}.")


def _check_fold_in(where: str, fold_in: Any) -> None:
  if fold_in is not None:
    raise ValueError(f"{where} must be None: the step is jitted over global arrays, so there "
                     "is no per-device axis to fold in (big_vision's configs use None too).")


def _check_xla_options(where: str, options: Any) -> None:
  bad = {k: v for k, v in _as_mapping(options, where).items()
         if not isinstance(v, (str, bool, int, float))}
  if bad:
    raise ValueError(f"{where} maps XLA option names to str, bool, int or float values; got "
                     f"{bad}.")


_dict = check_that("a dict", lambda v: isinstance(v, Mapping))

# A split of a TFDS dataset: the training input's `data`, an evaluator's `data`.
DATA_SCHEMA: Schema = {
    "name": Key(None, check_that("a TFDS dataset name", lambda v: isinstance(v, str),
                                 required=True)),
    "split": Key(None, check_that("a TFDS split, e.g. 'train'", lambda v: isinstance(v, str),
                                  required=True)),
    # None: TFDS's default (datasets.get_builder); memory pipeline: where fashion_mnist_local's
    # IDX files are (None: Debian's; data/arrays.py).
    "data_dir": Key(None),
    # None: the whole split; or a stratified part of it (a validation split: data/holdout.py).
    "holdout": Key(None, holdout.check_spec),
}

INPUT_SCHEMA: Schema = {
    # tfds: TFDS datasets through tf.data; memory: the offline datasets as arrays, the pp in JAX
    # on the device, no TensorFlow (data/inputs.py). The evaluators read through it too.
    "pipeline": Key("tfds", one_of(("tfds", "memory"))),
    "data": DATA_SCHEMA,
    "batch_size": Key(None, check_that("a positive int (the global batch)", is_positive_int,
                                       required=True)),
    "pp": Key(None, check_that("a pp string, e.g. 'decode|onehot(10)'",
                               lambda v: isinstance(v, str), required=True)),
    "prefetch": Key(2, check_that("an int >= 0 (host batches tf.data prepares ahead)",
                                  lambda v: isinstance(v, int) and v >= 0)),
}
# big_vision's shuffle_buffer_size and cache_raw have no meaning here: the pipeline shuffles
# globally by record index (data/input_pipeline.py), so setting them is an error, not a no-op.

# What optim.make_optimizer reads (its module docstring says what each key does).
OPTIMIZER_SCHEMA: Schema = {
    "optax_name": Key("scale_by_adam"),  # checked by optim (OPTIMIZERS)
    "optax": Key({}, _dict),  # its keys are checked by optim against the optax function's
    "lr": Key(None, check_that("a finite number > 0 (the peak learning rate, e.g. 1e-3); the "
                               "schedule scales it, the update subtracts it",
                               lambda v: is_number(v) and v > 0, required=True)),
    "wd": Key(0.0, check_that("a finite number >= 0 (decoupled decay per step, e.g. 1e-4; 0: "
                              "no weight decay)", lambda v: is_number(v) and v >= 0)),
    # Kernels only; an explicit [] decays nothing.
    "wd_mults": Key(((".*/kernel$", 1.0),), _check_mults),
    "lr_mults": Key((), _check_mults),
    "grad_clip_norm": Key(None, check_that("a finite number >= 0 (the global gradient norm to "
                                           "clip to, e.g. 1.0; 0 or None: no clipping)",
                                           lambda v: is_number(v) and v >= 0)),
    "schedule": Key(None, _check_schedule_key),
}

# Every key of a training config; the evaluators' own keys live under `evals` (checked by
# evaluators.registry).
TRAIN_SCHEMA: Schema = {
    "seed": Key(0, check_that("an int", lambda v: isinstance(v, int)
                              and not isinstance(v, bool))),
    **{key: _duration for key in TOTAL_KEYS},  # exactly one (validate_train_config)
    "input": INPUT_SCHEMA,
    "model_name": Key("vit", one_of(("vit",))),
    "model": Key(None, check_that("the keywords of vit.Model, e.g. dict(variant='S/16')",
                                  lambda v: isinstance(v, Mapping), required=True)),
    "num_classes": Key(None, check_that("a positive int (the head's outputs)", is_positive_int)),
    "init_head_bias": Key(None, check_that("a finite number", is_number)),
    "loss": Key("sigmoid_xent", one_of(losses.LOSSES)),
    **OPTIMIZER_SCHEMA,
    "mixup": {
        "p": Key(0.0, check_that("a probability in [0, 1] (0: no mixup)",
                                 lambda v: is_number(v) and 0 <= v <= 1)),
        "fold_in": Key(None, _check_fold_in),
    },
    # At most one of each group; unset, it is DURATION_DEFAULTS.
    **duration_schema("log_training"),
    **duration_schema("ckpt"),
    "keep_ckpt_steps": Key(None),  # checked by checkpoint.Checkpointer
    "keep_last_ckpts": Key(2),  # checked by checkpoint.Checkpointer
    "mesh": Key(((DATA_AXIS, -1),), _check_mesh),
    "sharding_strategy": Key(((".*", "replicate"),)),  # checked by sharding.tree_shardings
    "model_init": Key(None, check_that("a path (vit.load's)", lambda v: isinstance(v, str))),
    "model_load": {"dont_load": Key(())},  # regexes of parameters model_init does not load
    "evals": Key({}, _dict),
    "xla_compiler_options": Key({}, _check_xla_options),
}
# A duration group none of whose keys is set: log the training metrics every 50 steps,
# checkpoint at the end (100% of the run).
DURATION_DEFAULTS = {"log_training_steps": 50, "ckpt_percent": 1.0}


def fill_defaults(config: Mapping[str, Any], schema: Schema, where: str = "config"
                  ) -> ml_collections.ConfigDict:
  """A copy of `config` with every key of `schema`: unset keys (missing or None) take their
  default, every value passes its key's check, sub-configs are filled alike. Unknown keys
  raise ValueError."""
  given = {k: v for k, v in _as_mapping(config, where).items() if v is not None}
  check_keys(where, given, schema)
  filled = {}
  for key, spec in schema.items():
    name = f"{where}.{key}"
    if isinstance(spec, Key):
      filled[key] = given[key] if key in given else copy.deepcopy(spec.default)
      if spec.check is not None:
        spec.check(name, filled[key])
    else:
      filled[key] = fill_defaults(given.get(key, {}), spec, name)
  return ml_collections.ConfigDict(filled)


def validate_train_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config a run runs: `config` without its unset fields (`without_unset`), every key of
  `TRAIN_SCHEMA` filled in and checked, and the durations' defaults filled in. Also checks what
  spans keys and needs no dataset or devices: one run length, schedules shorter than it."""
  config = fill_defaults(without_unset(config), TRAIN_SCHEMA)
  total = {k: config[k] for k in TOTAL_KEYS if config[k] is not None}
  if len(total) != 1:
    given = ", ".join(f"{k}={v!r}" for k, v in total.items()) or "none"
    raise ValueError(
        f"Set exactly one of {', '.join(TOTAL_KEYS)} (got {given}). On the "
        "command line, clear the one the config file sets when you give another, e.g. "
        "--config.total_epochs=None --config.total_steps=1000.")
  for key, value in DURATION_DEFAULTS.items():
    prefix = key.rpartition("_")[0]
    if all(config[k] is None for k in duration_keys(prefix)):
      config[key] = value
  known_total = (get_steps(config, "total", total_steps=None, steps_per_epoch=None,
                           batch_size=config.input.batch_size)
                 if "total_epochs" not in total else None)  # epochs: the dataset size is unknown
  check_schedules(config.schedule, known_total)
  return config


def check_schedules(schedule: Any, total_steps: int | None = None,
                    where: str = "config.schedule") -> None:
  """Checks `config.schedule`: one schedule dict, or the dicts of a `[(regex, dict or None)]`
  list (see check_schedule; the list's structure is optim's to check). `total_steps`, when
  known, bounds the warmups."""
  if isinstance(schedule, (list, tuple)):
    for rule in schedule:
      if isinstance(rule, (list, tuple)) and len(rule) == 2 and rule[1] is not None:
        check_schedule(rule[1], total_steps, where=f"{where} rule {rule[0]!r}")
  else:
    check_schedule(schedule, total_steps, where)


def fill_schedule(schedule: Mapping[str, Any] | ml_collections.ConfigDict,
                  total_steps: int | None = None, where: str = "config.schedule"
                  ) -> dict[str, Any]:
  """One schedule dict, checked (`check_schedule`), with its defaults filled in (unset warmup
  keys stay absent)."""
  check_schedule(schedule, total_steps, where)
  cfg = {k: v for k, v in _as_mapping(schedule, where).items() if v is not None}
  filled = {**SCHEDULE_DEFAULTS, **cfg}
  return {**DECAY_TYPE_DEFAULTS[filled["decay_type"]], **filled}


def check_schedule(schedule: Mapping[str, Any] | ml_collections.ConfigDict,
                   total_steps: int | None = None, where: str = "config.schedule") -> None:
  """Checks one schedule dict (optim.make_schedule's keys): a known decay_type and its keys;
  a warmup of whole steps >= 0 or a fraction of the run in [0, 1), shorter than the run when
  `total_steps` is known; mult > 0; min, linear_end >= 0; timescale > 0."""
  cfg = {k: v for k, v in _as_mapping(schedule, where).items() if v is not None}
  decay_type = {**SCHEDULE_DEFAULTS, **cfg}["decay_type"]
  if decay_type not in DECAY_TYPES:
    raise ValueError(f"{where}.decay_type={decay_type!r} is unknown; valid: "
                     f"{list(DECAY_TYPES)}")
  valid = (*_SCHEDULE_KEYS, *DECAY_TYPE_DEFAULTS[decay_type])
  unknown = sorted(set(cfg) - set(valid))
  if unknown:
    raise ValueError(f"{where} has unknown keys {unknown}; valid keys: {sorted(valid)}")
  if "warmup_steps" in cfg and "warmup_percent" in cfg:
    raise ValueError(f"{where}: give warmup_steps OR warmup_percent, not both")
  warmup = None
  if "warmup_percent" in cfg:
    fraction = cfg["warmup_percent"]
    # big_vision's "_percent" durations are fractions of the run, not 0-100.
    if not is_number(fraction) or not 0 <= fraction < 1:
      raise ValueError(f"{where}.warmup_percent={fraction!r} must be a fraction in [0, 1) "
                       "(e.g. 0.1 for 10% of the run)")
  elif "warmup_steps" in cfg:
    warmup = cfg["warmup_steps"]
    if not is_number(warmup) or int(warmup) != warmup or warmup < 0:
      raise ValueError(f"{where}.warmup_steps={warmup!r} must be an integer >= 0")
  if warmup is not None and total_steps is not None and warmup >= total_steps:
    raise ValueError(f"{where}: warmup ({warmup} steps) must be shorter than the run "
                     f"({total_steps} steps); lower warmup_steps or use warmup_percent")
  for key, low, strict in (("mult", 0, True), ("min", 0, False), ("linear_end", 0, False),
                           ("timescale", 0, True)):
    if key in cfg and (not is_number(cfg[key]) or cfg[key] < low
                       or (strict and cfg[key] == low)):
      raise ValueError(f"{where}.{key}={cfg[key]!r} must be a finite number "
                       f"{'>' if strict else '>='} {low}")

