"""Non-image pp ops: one-hot labels and choosing which keys an example keeps."""
import tensorflow as tf

from big_vision_relu.data import pp_base
from big_vision_relu.data.pp.common import get_key
from big_vision_relu.data.pp.registry import Example, PPFn, register


@register("onehot")
def get_onehot(depth: int, key: str = "label", key_result: str = "labels", multi: bool = True,
               on: float = 1.0, off: float = 0.0) -> PPFn:
  """`example[key]` (int scalar, or int [k] for multi-label) -> float32 at key_result.

  Scalar labels give [depth]. [k] labels give a multi-hot [depth] (every listed class `on`) if
  `multi`, else [k, depth]. Defaults read TFDS's 'label' and write big_vision's 'labels'
  (big_vision's defaults are key='labels', key_result=key); `key` is kept.
  """
  if not (isinstance(depth, int) and depth > 0):
    raise ValueError(f"onehot: depth must be a positive int, got {depth!r}")

  def apply(example: Example) -> Example:
    labels = get_key(example, key, "onehot")
    if labels.shape.rank not in (0, 1):
      raise ValueError(f"onehot: {key!r} must be a scalar or a vector, got shape {labels.shape}")
    hot = tf.one_hot(labels, depth, on_value=True, off_value=False, dtype=tf.bool)
    if labels.shape.rank == 1 and multi:
      hot = tf.reduce_any(hot, axis=0)
    return {**example, key_result: tf.where(hot, tf.constant(on, tf.float32),
                                            tf.constant(off, tf.float32))}
  return apply


@register("keep")
def get_keep(*keys: str) -> PPFn:
  """Keeps only `keys` (each must exist), plus pipeline keys starting with '_' (e.g. '_rng')."""
  pp_base.check_keys("keep", keys)
  return lambda example: pp_base.keep(example, keys)


@register("drop")
def get_drop(*keys: str) -> PPFn:
  """Removes `keys` (each must exist)."""
  pp_base.check_keys("drop", keys)
  return lambda example: pp_base.drop(example, keys)
