"""Config helpers: `file.py:key=value` arguments, duration keys, and validation.

Configs are ml_collections ConfigDicts built by `get_config(arg)` in a python file; the trainer
validates them here before anything compiles, so a typo fails in a second, not after an hour.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections

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
  total = [k for k in duration_keys("total") if config.get(k) is not None]
  if len(total) != 1 or total == ["total_percent"]:
    raise ValueError("Set exactly one of total_steps, total_epochs, total_examples "
                     f"(got {total or 'none'}).")
  if config.get("loss", "sigmoid_xent") not in LOSSES:
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
  if config.get("model_name", "vit") != "vit":
    raise ValueError(f"Unknown model_name {config.model_name!r}; valid: vit.")

