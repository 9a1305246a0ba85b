"""What every evaluator does: apply the model it is given, and the config keys they share (for
their `CONFIG_SCHEMA`). Eval splits are read as global batches by `data.inputs.EvalData`."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from big_vision_relu import config as cfg_lib

BATCH_SIZE_KEY = cfg_lib.Key(None, cfg_lib.check_that(
    "a positive int (the global eval batch)", cfg_lib.is_positive_int, required=True))


def pp_key(produces: str) -> cfg_lib.Key:
  """A required pp string whose examples hold `produces` (e.g. "`image` and `labels`")."""
  return cfg_lib.Key(None, cfg_lib.check_that(f"a pp string producing {produces}",
                                              lambda v: isinstance(v, str), required=True))


def pred_key(default: str) -> cfg_lib.Key:
  """The model output an evaluator reads (`make_predict_fn`'s `output`)."""
  return cfg_lib.Key(default, cfg_lib.check_that(f"a key of the model's `out`, e.g. {default!r}",
                                                 lambda v: isinstance(v, str)))


def make_predict_fn(model: nn.Module, output: str) -> Callable[[Any, jax.Array], jax.Array]:
  """(params, images) -> the model's `out[output]` in eval mode (e.g. 'logits', 'pre_logits').

  `model` is applied as the ViT is: `model.apply({'params': params}, images, train=False)`
  returns `(logits, out)`.
  """
  def predict(params, images):
    _, out = model.apply({"params": params}, images, train=False)
    return out[output]
  return predict
