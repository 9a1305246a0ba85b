"""A ViT's forward pass that also returns what its attention did: the weights the encoder
blocks really use (sown by the model: `vit.Model(..., sow_attention_weights=True)`), the
queries and keys entering the scores, and each block's attention branch and residual input.

For every activation of the family and for `scan=True` models (split into layers here).
jax-traceable: the `attention_stats` evaluator runs it inside its jitted sums, and
`big_vision_relu.inspect` over a run's images; `attention_statistics` summarises the arrays.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import flax.linen as nn
import jax
from flax import traverse_util

from big_vision_relu.evaluators.attention_statistics import TokenLayout
from big_vision_relu.models import vit

# Paths (in the model's `intermediates`) of the encoder's attention weights and q/k inputs of
# the scores; `encoderblock_<i>` per layer, `encoderblock` (leading depth axis) with scan.
_ATTENTION = r"Transformer/encoderblock(?:_(\d+))?/MultiHeadDotProductAttention_0/"
_WEIGHTS = re.compile(_ATTENTION + r"attention_weights$")
_QK = re.compile(_ATTENTION + r"(query|key|query_ln|key_ln)/__call__$")
_QK_MODULES = ("query", "key", "query_ln", "key_ln")


def token_layout(model: vit._Model, image_hw: tuple[int, int]) -> TokenLayout:  # noqa: SLF001
  """The token layout of `model` for `[height, width]` images."""
  patch_h, patch_w = model.patch_size
  return TokenLayout(grid_shape=(image_hw[0] // patch_h, image_hw[1] // patch_w),
                     num_prefix_tokens=1 if model.pool_type == "tok" else 0)


def apply_inspecting(model: vit._Model, params: Any, images: jax.Array, *,  # noqa: SLF001
                     with_qk: bool = True) -> dict[str, Any]:
  """One eval-mode forward pass that also returns what the attention did (jax-traceable).

  Args:
    model: the ViT. Its `sow_attention_weights` is switched on here, and its attention runs
      dense: the blockwise implementations (`attention_impl` chunked, seq_parallel, pallas)
      compute the same function from the same parameters but never hold the weights.
    params: its parameters.
    images: `[n, h, w, c]`.
    with_qk: also capture the queries and keys entering the scores (after qk-LN, if any).
  Returns:
    {'logits': `[n, ...]` (the model's output), 'weights': per layer `[n, heads, q, k]`,
    'attention_outputs': per layer the attention branch `[n, tokens, width]` (what the block
    adds to its input), 'block_inputs': per layer the residual stream entering the block
    `[n, tokens, width]`, and with_qk 'queries': per layer `[n, q, heads, head_dim]`, 'keys':
    `[n, k, heads, d]`}. Unused outputs cost nothing under jit (XLA drops them).
  """
  def capture(module: nn.Module, method: str) -> bool:
    return with_qk and method == "__call__" and module.name in _QK_MODULES

  model = model.clone(sow_attention_weights=True, attention_options=dataclasses.replace(
      model.attention_options, impl="dense"))
  (logits, aux), state = model.apply(
      {"params": params}, images, train=False, mutable=["intermediates"],
      capture_intermediates=capture)
  found: dict[str, dict[int, jax.Array]] = {}
  for path, sown in traverse_util.flatten_dict(state["intermediates"], sep="/").items():
    (value,) = sown  # sow keeps a tuple of the values sown (one call each here)
    if match := _WEIGHTS.match(path):
      name, layer = "weights", match.group(1)
    elif match := _QK.match(path):
      name, layer = match.group(2), match.group(1)
    else:
      continue
    if layer is None:  # scanned: a leading depth axis
      found.setdefault(name, {}).update(enumerate(value))
    else:
      found.setdefault(name, {})[int(layer)] = value
  as_list = lambda name: [found[name][i] for i in range(len(found[name]))]  # noqa: E731
  blocks = [aux["encoder"][f"block{layer:02d}"] for layer in range(model.depth)]
  out = {"logits": logits, "weights": as_list("weights"),
         "attention_outputs": [block["sa"] for block in blocks],
         # The block's input is not kept by the model; its sum with the branch ("+sa") is.
         "block_inputs": [block["+sa"] - block["sa"] for block in blocks]}
  if with_qk:
    # With qk-LN the scores use the normalised q and k.
    out["queries"] = as_list("query_ln" if "query_ln" in found else "query")
    out["keys"] = as_list("key_ln" if "key_ln" in found else "key")
  return out
