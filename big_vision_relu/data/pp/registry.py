"""The pp mini-language on tf.data: the op registry.

A pp string chains ops with `|`, e.g. `decode|resize(224)|value_range(-1, 1)|keep("image")`
(its syntax: `pp_base.parse`, shared with the in-memory pipeline's ops, `jax_pp`).

An op is registered by decorating a factory: `@register("name") def get_name(*args, **kw)`
returns a function from an example dict of tf tensors to a new example dict. Factories run
when the pp string is parsed, so wrong arguments fail before any data is read.
"""
from collections.abc import Callable

import tensorflow as tf

from big_vision_relu.data.pp_base import parse

Example = dict[str, tf.Tensor]
PPFn = Callable[[Example], Example]

_REGISTRY: dict[str, Callable[..., PPFn]] = {}


def register(name: str) -> Callable[[Callable[..., PPFn]], Callable[..., PPFn]]:
  """Decorator registering a pp op factory under `name` (ValueError if taken)."""
  def decorator(factory: Callable[..., PPFn]) -> Callable[..., PPFn]:
    if name in _REGISTRY:
      raise ValueError(f"pp op {name!r} is already registered by {_REGISTRY[name]}")
    _REGISTRY[name] = factory
    return factory
  return decorator


def registered_ops() -> list[str]:
  """Sorted names of all registered pp ops."""
  return sorted(_REGISTRY)


def get_op(name: str, *args, **kwargs) -> PPFn:
  """Instantiates one registered op (ValueError listing the registered ops if unknown)."""
  if name not in _REGISTRY:
    raise ValueError(f"Unknown pp op {name!r}. Registered ops: {', '.join(registered_ops())}")
  try:
    return _REGISTRY[name](*args, **kwargs)
  except TypeError as e:
    raise ValueError(f"pp op {name} rejected its arguments {args} {kwargs}: {e}") from None


def get_preprocess_fn(pp_str: str) -> PPFn:
  """Parses `pp_str` into one function: example dict -> example dict (ops applied in order)."""
  fns = [get_op(name, *args, **kwargs) for name, args, kwargs in parse(pp_str)]

  # The ops are graph code already (static Python branches, tf.cond where the data decides):
  # tf.data's autograph conversion of every op's source would only cost time at each trainer
  # start (with input_pipeline._map's, ~3.5 s of a core).
  @tf.autograph.experimental.do_not_convert
  def apply(example: Example) -> Example:
    for fn in fns:
      example = fn(example)
    return example

  return apply
