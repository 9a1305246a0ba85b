r"""Compute estimates for a sweep: training FLOPs from the model shape and the step count, and
TPU core hours under a stated peak and model FLOP utilisation (MFU).

    python -m big_vision_relu.experiments.cost configs/paper/fig1.py [--peak_tflops 61.5 --mfu 0.4]

These are ESTIMATES, not measurements: FLOPs are counted analytically on the trainer's model
(matmuls only: patch embedding, q/k/v/out and gate projections, q.k and weights.v, MLP, head; x3
for forward + backward), the step count is the trainer's (`run_status.total_steps`, with the
dataset sizes of recipes.TRAIN_SPLIT_SIZES), and core hours assume
every core runs at `mfu * peak_tflops`. Defaults: a TPU v3 core (61.5 bf16 TFLOP/s, half a
chip's 123) at 40% MFU, typical of big_vision's ViT training.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections
from absl import app, flags

from big_vision_relu.experiments import run_status, sweep
from big_vision_relu.models import vit

def forward_flops_per_image(model_kwargs: Mapping[str, Any], image_size: int = 224,
                            channels: int = 3, num_classes: int = 0) -> int:
  """Matmul FLOPs (2 per multiply-add) of one image's forward pass through the ViT that
  `config.model = model_kwargs` gives the trainer (`vit.Model`: its variant decoded, every
  option it leaves unset at the model's default): the patch embedding, per layer the q, k, v,
  out (and gate) projections, q.k and weights.v and the MLP on every token (the class token
  too), the pre-logits and the head once (a MAP head's matmuls are left out)."""
  model = vit.Model(num_classes or None, **model_kwargs)
  width, (patch_h, patch_w) = model.width, model.patch_size
  patches = (image_size // patch_h) * (image_size // patch_w)
  tokens = patches + (model.pool_type == "tok")
  mlp_dim = model.mlp_dim or 4 * width  # the model's MLP width when unset (vit._Model)
  projections = 4 + model.attention_options.gated  # q, k, v, out (+ gate)
  per_layer = (2 * tokens * projections * width ** 2      # projections
               + 2 * 2 * tokens ** 2 * width              # q.k and weights.v
               + 2 * 2 * tokens * width * mlp_dim)        # MLP
  stem = 2 * patches * patch_h * patch_w * channels * width
  rep_size = width if model.rep_size is True else int(model.rep_size)
  head = 2 * (rep_size or width) * num_classes + 2 * width * rep_size
  return stem + model.depth * per_layer + head


def training_steps_and_flops(config: ml_collections.ConfigDict, image_size: int = 224,
                             channels: int = 3) -> tuple[int, int]:
  """(steps, matmul FLOPs of the whole training) of a training config on images of that shape:
  its steps as the trainer counts them (`run_status.total_steps`), 3x the forward (forward +
  backward) of each image of each batch."""
  steps = run_status.total_steps(config)
  if steps is None:
    data = config.input.data
    raise ValueError(f"{(data.get('name'), data.get('split'))}: add its split size to "
                     "recipes.TRAIN_SPLIT_SIZES.")
  return steps, 3 * steps * config.input.batch_size * forward_flops_per_image(
      config.model, image_size, channels, config.num_classes)


def run_estimate(run: sweep.Run, *, peak_tflops: float, mfu: float) -> dict:
  """{'steps', 'train_pflops', 'core_hours'} of one sweep run."""
  steps, flops = training_steps_and_flops(sweep.load_config(run))
  return {"steps": steps, "train_pflops": flops / 1e15,
          "core_hours": flops / (peak_tflops * 1e12 * mfu) / 3600}


def main(argv: list[str]) -> None:
  total = 0.0
  for path in argv[1:]:
    runs = sweep.load_sweep(path)
    subtotal = 0.0
    for run in runs:
      estimate = run_estimate(run, peak_tflops=FLAGS.peak_tflops, mfu=FLAGS.mfu)
      subtotal += estimate["core_hours"]
      if FLAGS.per_run:
        print(f"{run.run_id}\t{estimate['steps']}\t{estimate['core_hours']:.0f}")
    print(f"{sweep.sweep_name(path)}: {len(runs)} runs, ~{subtotal:,.0f} core hours "
          f"(estimate: {FLAGS.peak_tflops} TFLOP/s per core at {FLAGS.mfu:.0%} MFU)")
    total += subtotal
  if len(argv) > 2:
    print(f"total: ~{total:,.0f} core hours")


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_float("peak_tflops", 61.5, "Peak TFLOP/s of one core (TPU v3: 61.5 bf16).")
  flags.DEFINE_float("mfu", 0.4, "Assumed model FLOP utilisation.")
  flags.DEFINE_bool("per_run", False, "Also print each run's steps and core hours.")
  app.run(main)
