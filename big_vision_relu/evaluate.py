r"""Runs a config's evaluators on a checkpoint of a finished or running run.

    python -m big_vision_relu.evaluate --workdir DIR                 # newest checkpoint of DIR
    python -m big_vision_relu.evaluate --checkpoint DIR/checkpoints/1000
    python -m big_vision_relu.evaluate --config configs/X.py:args --workdir DIR

The config defaults to the run's own `config.json`; `--config` may replace it (e.g. to add
evaluators: only `evals` and the model must stay compatible with the checkpoint). Results are
printed as JSON and, with `--write`, appended to the run's metrics.jsonl and TensorBoard
events at the checkpoint's step, under the same `<eval name>/<metric>` names as in training.
"""
from __future__ import annotations

import json
from typing import Any

from absl import app, flags
from ml_collections import config_flags

import big_vision_relu  # noqa: F401  (quiets TensorFlow)
import jax
import ml_collections
from etils import epath

from big_vision_relu import checkpoint as ckpt_lib
from big_vision_relu import metrics as metrics_lib
from big_vision_relu import multihost
from big_vision_relu import run as run_lib
from big_vision_relu import workdir_config


def evaluate(config: ml_collections.ConfigDict, checkpoint_dir: str, step: int | None = None,
             write_to: str | None = None) -> dict[str, Any]:
  """Restores `step` (default: the newest readable) from `checkpoint_dir` and runs every
  evaluator of `config.evals`. Returns {'step': s, '<eval>/<metric>': value, ...}."""
  run = run_lib.setup(config)
  evaluators = run_lib.make_evaluators(run)
  if not evaluators:
    raise ValueError("config.evals is empty: nothing to evaluate.")
  ckpt = ckpt_lib.Checkpointer(checkpoint_dir, save_interval_steps=1)
  try:
    if step is None:
      restored = ckpt.restore_latest(run.target)
      if restored is None:
        raise FileNotFoundError(f"No checkpoint in {checkpoint_dir}.")
    else:
      restored = ckpt.restore(step, run.target)
  finally:
    ckpt.close()
  results: dict[str, Any] = {"step": restored.step}
  with jax.set_mesh(run.mesh):  # as in training: seq_parallel attention finds its axis there
    for evaluator in evaluators:
      for name, value in evaluator.run(restored.state["params"]).items():
        results[f"{evaluator.name}/{name}"] = value
  if write_to is not None:
    with metrics_lib.MetricWriter(write_to) as writer:
      writer.write_scalars(restored.step, {k: v for k, v in results.items() if k != "step"})
  return results


def main(argv: list[str]) -> None:
  del argv
  multihost.initialize_from_flags(FLAGS)
  if bool(FLAGS.workdir) == bool(FLAGS.checkpoint):
    raise app.UsageError("Pass exactly one of --workdir and --checkpoint.")
  if FLAGS.checkpoint:
    step_dir = epath.Path(FLAGS.checkpoint)
    if not step_dir.name.isdigit():
      raise app.UsageError(f"--checkpoint must be a step directory like "
                           f"WORKDIR/checkpoints/1000, got {step_dir}.")
    checkpoint_dir, step, workdir = step_dir.parent, int(step_dir.name), step_dir.parent.parent
  else:
    workdir = epath.Path(FLAGS.workdir)
    checkpoint_dir, step = workdir / "checkpoints", None
  config = FLAGS.config if FLAGS.config is not None else workdir_config.read_config(str(workdir))
  results = evaluate(config, str(checkpoint_dir), step,
                     write_to=str(workdir) if FLAGS.write else None)
  if jax.process_index() == 0:
    print(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  config_flags.DEFINE_config_file("config", None, "Config file (default: the run's "
                                  "config.json).", lock_config=True)
  flags.DEFINE_string("workdir", None, "A training workdir: evaluates its newest checkpoint.")
  flags.DEFINE_string("checkpoint", None, "A checkpoint step directory to evaluate.")
  flags.DEFINE_bool("write", False, "Append the results to the run's metrics.jsonl and "
                    "TensorBoard events at the checkpoint's step.")
  multihost.define_flags()
  app.run(main)
