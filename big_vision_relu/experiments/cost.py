r"""Compute estimates for a sweep: training FLOPs from the model shape and the step count, and
TPU core hours under a stated peak and model FLOP utilisation (MFU).

    python -m big_vision_relu.experiments.cost configs/paper/fig1.py [--peak_tflops 61.5 --mfu 0.4]

These are ESTIMATES, not measurements: FLOPs are counted analytically (matmuls only: patch
embedding, q/k/v/out and gate projections, q.k and weights.v, MLP, head; x3 for forward +
backward), the step count follows the recipe (dataset sizes below), and core hours assume
every core runs at `mfu * peak_tflops`. Defaults: a TPU v3 core (61.5 bf16 TFLOP/s, half a
chip's 123) at 40% MFU, typical of big_vision's ViT training.
"""
from __future__ import annotations

import math

import ml_collections
from absl import app, flags

from big_vision_relu.experiments import recipes, sweep
from big_vision_relu.models import vit

def forward_flops_per_image(model_kwargs: dict, image_size: int = 224, channels: int = 3,
                            num_classes: int = 0) -> int:
  """Matmul FLOPs (2 per multiply-add) of one image's forward pass through the ViT."""
  variant = model_kwargs.get("variant")  # optional: configs may give width, depth, ... instead
  kw = {**(vit.decode_variant(variant) if variant else {}), **model_kwargs}
  width, depth, patch = kw["width"], kw["depth"], kw["patch_size"][0]
  mlp_dim = kw.get("mlp_dim") or 4 * width
  tokens = (image_size // patch) ** 2 + (kw.get("pool_type") == "tok")
  projections = 4 + bool(kw.get("gated"))  # q, k, v, out (+ gate)
  per_layer = (2 * tokens * projections * width ** 2      # projections
               + 2 * 2 * tokens ** 2 * width              # q.k and weights.v
               + 2 * 2 * tokens * width * mlp_dim)        # MLP
  stem = 2 * (image_size // patch) ** 2 * patch * patch * channels * width
  head = 2 * width * num_classes + (2 * width * width if kw.get("rep_size") else 0)
  return stem + depth * per_layer + head


def training_steps_and_flops(config: ml_collections.ConfigDict, image_size: int = 224,
                             channels: int = 3) -> tuple[int, int]:
  """(steps, matmul FLOPs of the whole training) of a training config on images of that shape."""
  examples = recipes.train_split_size(config.input.data)
  if examples is None:
    raise ValueError(f"{config.input.data}: add its split size to recipes.TRAIN_SPLIT_SIZES.")
  steps = math.ceil(config.total_epochs * examples / config.input.batch_size - 1e-9)
  return steps, 3 * steps * config.input.batch_size * forward_flops_per_image(
      dict(config.model), image_size, channels, config.num_classes)


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
