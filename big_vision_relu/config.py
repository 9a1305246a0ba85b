"""Config helpers: `file.py:key=value` arguments, optional fields, duration keys, validation.

Configs are ml_collections ConfigDicts built by `get_config(arg)` in a python file; the trainer
validates them here before anything compiles, so a typo fails in a second, not after an hour.
A field whose value is None means "unset" everywhere (the same as a missing key).
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections
from ml_collections import config_dict

DURATION_UNITS = ("steps", "epochs", "examples", "percent")

# Every key the trainer reads (and the evaluators' own keys live under `evals`).
TRAIN_KEYS = {
    "seed", "total_steps", "total_epochs", "total_examples",
    "input", "pp_modules", "model_name", "model", "num_classes", "init_head_bias", "loss",
    "optax_name", "optax", "lr", "wd", "wd_mults", "lr_mults", "grad_clip_norm", "schedule",
    "mixup", "log_training_steps", "log_training_epochs", "log_training_examples",
    "log_training_percent", "ckpt_steps", "ckpt_epochs", "ckpt_examples", "ckpt_percent",
    "keep_ckpt_steps", "keep_last_ckpts", "mesh", "sharding_strategy", "sharding_rules",
    "model_init", "model_load", "evals", "xla_compiler_options",
}
# big_vision's shuffle_buffer_size and cache_raw have no meaning here: the pipeline shuffles
# globally by record index (data/input_pipeline.py), so setting them is an error, not a no-op.
INPUT_KEYS = {"data", "batch_size", "pp", "prefetch"}
DATA_KEYS = {"name", "split", "data_dir"}
LOSSES = ("sigmoid_xent", "softmax_xent")
DECAY_TYPES = ("cosine", "linear", "rsqrt")
_SCHEDULE_KEYS = ("decay_type", "warmup_steps", "warmup_percent", "mult")
_DECAY_TYPE_KEYS = {"cosine": ("min",), "linear": ("linear_end",), "rsqrt": ("timescale",)}


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
  so that `config.get(key, default)` gives the default for them, as for a missing key."""
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
  first key ('B/16' -> variant='B/16'). Values take the type of their default. Unknown keys raise ValueError.
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
              steps_per_epoch: float | None, batch_size: int, required: bool = False
              ) -> int | None:
  """Resolves `{prefix}_steps|_epochs|_examples|_percent` in `config` to a number of steps.

  At most one of the four may be set; `_percent` is a fraction of `total_steps` in [0, 1]
  (big_vision's convention: 0.1 is 10%). Returns None when none is
  set and not `required`.
  """
  given = {k: config[k] for k in duration_keys(prefix) if config.get(k) is not None}
  if len(given) > 1:
    raise ValueError(f"Contradictory durations: set only one of {', '.join(given)}.")
  if not given:
    if required:
      raise ValueError(f"Set one of {', '.join(duration_keys(prefix))}.")
    return None
  (key, value), = given.items()
  unit = key[len(prefix) + 1:]
  if unit == "steps":
    steps = value
  elif unit == "examples":
    steps = value / batch_size
  elif unit == "epochs":
    if steps_per_epoch is None:
      raise ValueError(f"{key} needs the dataset size, which is unknown here.")
    steps = value * steps_per_epoch
  else:
    if total_steps is None:
      raise ValueError(f"{key} is relative to the total steps, which are unknown here.")
    if not 0 < value <= 1:
      raise ValueError(f"{key}={value!r} must be a fraction in (0, 1] (0.1 = 10% of the run).")
    steps = value * total_steps
  if not (isinstance(steps, (int, float)) and math.isfinite(steps) and steps > 0):
    raise ValueError(f"{key}={value!r} must be a positive number.")
  return max(1, math.ceil(steps - 1e-9))


def check_keys(where: str, config: Mapping[str, Any], allowed: Iterable[str]) -> None:
  """Raises ValueError naming unknown keys in `config` (a typo would otherwise be ignored)."""
  allowed = set(allowed)
  unknown = sorted(set(config) - allowed)
  if unknown:
    raise ValueError(f"Unknown key(s) in {where}: {', '.join(unknown)}. Valid keys: "
                     f"{', '.join(sorted(allowed))}.")


def validate_train_config(config: ml_collections.ConfigDict) -> None:
  """Structural checks of a training config that need no dataset or devices."""
  check_keys("config", config, TRAIN_KEYS)
  for key in ("input", "model", "evals"):
    if key not in config and key != "evals":
      raise ValueError(f"The config needs `{key}`.")
  check_keys("config.input", config.input, INPUT_KEYS)
  if "data" not in config.input or "name" not in config.input.data:
    raise ValueError("Set config.input.data.name (a TFDS dataset name) and .split.")
  check_keys("config.input.data", config.input.data, DATA_KEYS)
  for key in ("batch_size", "pp"):
    if key not in config.input:
      raise ValueError(f"Set config.input.{key}.")
  if not isinstance(config.input.batch_size, int) or config.input.batch_size <= 0:
    raise ValueError(f"config.input.batch_size must be a positive int, got "
                     f"{config.input.batch_size!r}.")
  total = {k: config[k] for k in duration_keys("total") if config.get(k) is not None}
  if len(total) != 1 or "total_percent" in total:
    given = ", ".join(f"{k}={v!r}" for k, v in total.items()) or "none"
    raise ValueError(
        f"Set exactly one of total_steps, total_epochs, total_examples (got {given}). On the "
        "command line, clear the one the config file sets when you give another, e.g. "
        "--config.total_epochs=None --config.total_steps=1000.")
  (key, value), = total.items()
  if not _is_number(value) or value <= 0:
    raise ValueError(f"config.{key}={value!r} must be a positive number.")
  if (config.get("loss") or "sigmoid_xent") not in LOSSES:
    raise ValueError(f"Unknown loss {config.loss!r}; valid: {', '.join(LOSSES)}.")
  if config.get("mixup") is not None:
    check_keys("config.mixup", config.mixup, ("p", "fold_in"))
    if config.mixup.get("fold_in") is not None:
      raise ValueError("config.mixup.fold_in must be None: the step is jitted over global "
                       "arrays, so there is no per-device axis to fold in (big_vision's configs "
                       "use None too).")
  if config.get("model_load") is not None:
    check_keys("config.model_load", config.model_load, ("dont_load",))
  options = config.get("xla_compiler_options") or {}
  bad = {k: v for k, v in dict(options).items() if not isinstance(v, (str, bool, int, float))}
  if bad:
    raise ValueError(f"config.xla_compiler_options maps XLA option names to str, bool, int or "
                     f"float values; got {bad}.")
  if (config.get("model_name") or "vit") != "vit":
    raise ValueError(f"Unknown model_name {config.model_name!r}; valid: vit.")
  known_total = (get_steps(config, "total", total_steps=None, steps_per_epoch=None,
                           batch_size=config.input.batch_size)
                 if "total_epochs" not in total else None)  # epochs: the dataset size is unknown
  check_optimizer(config, known_total)


def _is_number(value: Any) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def _as_mapping(value: Any, where: str) -> Mapping[str, Any]:
  if isinstance(value, ml_collections.ConfigDict):
    return value.to_dict()
  if isinstance(value, Mapping):
    return value
  raise ValueError(f"{where} must be a dict, got {type(value).__name__}: {value!r}")


def check_optimizer(config: Mapping[str, Any] | ml_collections.ConfigDict,
                    total_steps: int | None = None) -> None:
  """Range checks of the optimizer's values: lr, wd, grad_clip_norm, lr_mults and wd_mults
  values, and every schedule (see check_schedule). `total_steps`, when known, bounds the
  warmup. Structural errors of the rule lists are left to optim.make_optimizer."""
  lr = config.get("lr")
  if lr is None:
    raise ValueError("config.lr is required (the peak learning rate, e.g. 1e-3).")
  if not _is_number(lr) or lr <= 0:
    raise ValueError(f"config.lr={lr!r} must be a finite number > 0 (the peak learning rate, "
                     "e.g. 1e-3); the schedule scales it, the update subtracts it.")
  wd = config.get("wd")
  if wd is not None and (not _is_number(wd) or wd < 0):
    raise ValueError(f"config.wd={wd!r} must be a finite number >= 0 (decoupled decay per "
                     "step, e.g. 1e-4; 0 or None: no weight decay).")
  clip = config.get("grad_clip_norm")
  if clip is not None and (not _is_number(clip) or clip < 0):
    raise ValueError(f"config.grad_clip_norm={clip!r} must be a finite number >= 0 (the "
                     "global gradient norm to clip to, e.g. 1.0; 0 or None: no clipping).")
  for name in ("lr_mults", "wd_mults"):
    for rule in config.get(name) or ():
      if isinstance(rule, (list, tuple)) and len(rule) == 2 and not (
          _is_number(rule[1]) and rule[1] >= 0):
        raise ValueError(f"config.{name}: the multiplier of {rule[0]!r} is {rule[1]!r}; it "
                         "must be a finite number >= 0 (0 turns it off for those params).")
  schedule = config.get("schedule")
  if schedule is None:
    raise ValueError("config.schedule is required, e.g. dict(warmup_steps=10_000, "
                     "decay_type='cosine').")
  if isinstance(schedule, (list, tuple)):
    for rule in schedule:
      if isinstance(rule, (list, tuple)) and len(rule) == 2 and rule[1] is not None:
        check_schedule(rule[1], total_steps, where=f"config.schedule rule {rule[0]!r}")
  else:
    check_schedule(schedule, total_steps)


def check_schedule(schedule: Mapping[str, Any] | ml_collections.ConfigDict,
                   total_steps: int | None = None, where: str = "config.schedule") -> None:
  """Checks one schedule dict (optim.make_schedule's keys): a known decay_type and its keys;
  a warmup of whole steps >= 0 or a fraction of the run in [0, 1), shorter than the run when
  `total_steps` is known; mult > 0; min, linear_end >= 0; timescale > 0."""
  cfg = {k: v for k, v in _as_mapping(schedule, where).items() if v is not None}
  decay_type = cfg.get("decay_type", "cosine")
  if decay_type not in DECAY_TYPES:
    raise ValueError(f"{where}.decay_type={decay_type!r} is unknown; valid: "
                     f"{list(DECAY_TYPES)}")
  valid = _SCHEDULE_KEYS + _DECAY_TYPE_KEYS[decay_type]
  unknown = sorted(set(cfg) - set(valid))
  if unknown:
    raise ValueError(f"{where} has unknown keys {unknown}; valid keys: {sorted(valid)}")
  if "warmup_steps" in cfg and "warmup_percent" in cfg:
    raise ValueError(f"{where}: give warmup_steps OR warmup_percent, not both")
  warmup = None
  if "warmup_percent" in cfg:
    fraction = cfg["warmup_percent"]
    # big_vision's "_percent" durations are fractions of the run, not 0-100.
    if not _is_number(fraction) or not 0 <= fraction < 1:
      raise ValueError(f"{where}.warmup_percent={fraction!r} must be a fraction in [0, 1) "
                       "(e.g. 0.1 for 10% of the run)")
  elif "warmup_steps" in cfg:
    warmup = cfg["warmup_steps"]
    if not _is_number(warmup) or int(warmup) != warmup or warmup < 0:
      raise ValueError(f"{where}.warmup_steps={warmup!r} must be an integer >= 0")
  if warmup is not None and total_steps is not None and warmup >= total_steps:
    raise ValueError(f"{where}: warmup ({warmup} steps) must be shorter than the run "
                     f"({total_steps} steps); lower warmup_steps or use warmup_percent")
  for key, low, strict in (("mult", 0, True), ("min", 0, False), ("linear_end", 0, False),
                           ("timescale", 0, True)):
    if key in cfg and (not _is_number(cfg[key]) or cfg[key] < low
                       or (strict and cfg[key] == low)):
      raise ValueError(f"{where}.{key}={cfg[key]!r} must be a finite number "
                       f"{'>' if strict else '>='} {low}")

