"""Classification losses: the training loss (`config.loss`) and the classification evaluator's.

Each maps `[batch, classes]` logits and (multi-)hot labels to a `[batch]` loss, in float32.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax


def sigmoid_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """The sum of the per-class binary cross-entropies (big_vision's convention)."""
  return optax.sigmoid_binary_cross_entropy(logits, labels).sum(-1)


def softmax_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """The cross-entropy with the labels normalised to sum to one."""
  targets = labels / jnp.maximum(labels.sum(-1, keepdims=True), 1e-9)
  return optax.softmax_cross_entropy(logits, targets)


LOSSES: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "sigmoid_xent": sigmoid_xent,
    "softmax_xent": softmax_xent,
}


def per_example_loss(logits: jax.Array, labels: jax.Array, loss_name: str) -> jax.Array:
  """[batch, classes] logits and (multi-)hot labels -> [batch] loss `LOSSES[loss_name]`."""
  if loss_name not in LOSSES:
    raise ValueError(f"Unknown loss {loss_name!r}; valid: {', '.join(LOSSES)}.")
  return LOSSES[loss_name](logits.astype(jnp.float32), labels)
