"""A run's model over some images, with what its attention did, as numpy arrays; and the
per-layer table of the statistics of `evaluators.attention_statistics`."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from big_vision_relu.evaluators import attention_capture
from big_vision_relu.evaluators import attention_statistics as statistics_lib
from big_vision_relu.inspect.loading import Run


@dataclasses.dataclass(frozen=True)
class Inspection:
  """A forward pass over some images, as numpy arrays (`attention_capture.apply_inspecting`)."""
  logits: np.ndarray  # [n, classes]
  weights: list[np.ndarray]  # per layer [n, heads, q, k]
  queries: list[np.ndarray]  # per layer [n, q, heads, head_dim]
  keys: list[np.ndarray]  # per layer [n, k, heads, head_dim]
  attention_outputs: list[np.ndarray]  # per layer [n, tokens, width]
  block_inputs: list[np.ndarray]  # per layer [n, tokens, width]
  grid_shape: tuple[int, int]
  num_prefix_tokens: int

  def select(self, index: Any) -> Inspection:
    """The inspection of some of the images: `index` as for numpy (slice, indices, mask)."""
    pick = lambda arrays: [a[index] for a in arrays]  # noqa: E731
    return dataclasses.replace(self, logits=self.logits[index], weights=pick(self.weights),
                               queries=pick(self.queries), keys=pick(self.keys),
                               attention_outputs=pick(self.attention_outputs),
                               block_inputs=pick(self.block_inputs))


def run_model(run: Run, images: np.ndarray, batch_size: int = 64) -> Inspection:
  """Runs `images` `[n, h, w, c]` (already preprocessed) through the run's model, in batches.

  Batches have min(n, batch_size) images, the last one padded: one compilation per call.
  """
  if images.ndim != 4 or not len(images):
    raise ValueError(f"images must be [n > 0, height, width, channels], got {images.shape}.")
  batch = min(len(images), batch_size)
  parts = []
  for start in range(0, len(images), batch):
    chunk = images[start:start + batch]
    padded = np.concatenate([chunk, np.zeros((batch - len(chunk), *chunk.shape[1:]),
                                             chunk.dtype)])
    out = jax.device_get(run.forward(run.params, jnp.asarray(padded)))
    parts.append(jax.tree.map(lambda x, n=len(chunk): x[:n], out))
  joined = jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
  layout = attention_capture.token_layout(run.model, images.shape[1:3])
  return Inspection(logits=joined["logits"], weights=joined["weights"],
                    queries=joined["queries"], keys=joined["keys"],
                    attention_outputs=joined["attention_outputs"],
                    block_inputs=joined["block_inputs"],
                    grid_shape=layout.grid_shape, num_prefix_tokens=layout.num_prefix_tokens)


def attention_maps(run: Run, images: np.ndarray, batch_size: int = 64) -> list[np.ndarray]:
  """The attention weights of every encoder layer, `[n, heads, q_len, k_len]` each."""
  return run_model(run, images, batch_size).weights


def layer_table(inspection: Inspection) -> list[dict[str, float]]:
  """`attention_statistics`, `qk_logit_norms` and `attention_shares` of an inspection, one
  row per layer."""
  stats = statistics_lib.attention_statistics(inspection.weights, inspection.grid_shape,
                                              inspection.num_prefix_tokens)
  norms = statistics_lib.qk_logit_norms(inspection.queries, inspection.keys)
  shares = statistics_lib.attention_shares(inspection.attention_outputs,
                                           inspection.block_inputs)
  return [{**s, **n, **a} for s, n, a in zip(stats, norms, shares, strict=True)]
