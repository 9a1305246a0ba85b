"""Helpers shared by pp ops: reading keys with clear errors, per-example random seeds.

Randomness: the training pipeline puts a per-example stateless seed, int64 [2], under
`RNG_KEY` ('_rng'). Every random op calls `take_seed`, which splits that seed into one for
the op and one that replaces `_rng` for the ops after it. The output of a pp string is hence
a pure function of (pp string, example, `_rng`): no hidden state, no dependence on threads.
"""
import tensorflow as tf

from big_vision_relu.data.pp.registry import Example
from big_vision_relu.data.pp_base import as_size, get_key  # noqa: F401  (the ops' helpers)

RNG_KEY = "_rng"


def take_seed(example: Example, op_name: str) -> tuple[Example, tf.Tensor]:
  """Splits `example['_rng']`: returns (example with a fresh `_rng`, seed int64 [2] for the op)."""
  if RNG_KEY not in example:
    raise ValueError(
        f"pp op {op_name} is random and needs a per-example seed under {RNG_KEY!r}. "
        "input_pipeline.training_batches adds it; evaluation pipelines do not, so keep "
        "random ops out of eval pp strings.")
  seeds = tf.random.experimental.stateless_split(tf.cast(example[RNG_KEY], tf.int64), num=2)
  return {**example, RNG_KEY: seeds[0]}, seeds[1]
