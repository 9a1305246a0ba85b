"""What every evaluator does: apply the model it is given, iterate an eval split as global
(sharded) batches, and the config keys they share (for their `CONFIG_SCHEMA`)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax

from big_vision_relu import config as cfg_lib
from big_vision_relu.data import input_pipeline

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


def global_eval_batches(data: Mapping[str, str], pp: str, batch_size: int, *,
                        mesh: jax.sharding.Mesh, data_axis: str | tuple[str, ...]
                        ) -> Iterator[dict[str, jax.Array]]:
  """One pass over `data` as global batches `[batch_size, ...]` sharded over `data_axis`.

  Every process yields the same number of batches (the last ones padded; `_mask` False), each
  process contributing its share of the split (see `input_pipeline.eval_batches`).
  """
  batches = input_pipeline.eval_batches(data, pp, batch_size,
                                        process_index=jax.process_index(),
                                        process_count=jax.process_count())
  try:
    for host_batch in batches:
      yield input_pipeline.make_global_batch(host_batch, mesh, data_axis)
  finally:
    batches.close()
