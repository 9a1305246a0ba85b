r"""Runs a config's evaluators on a checkpoint of a finished or running run.

    python -m big_vision_relu.evaluate --workdir DIR                 # newest checkpoint of DIR
    python -m big_vision_relu.evaluate --checkpoint DIR/checkpoints/1000
    python -m big_vision_relu.evaluate --config configs/X.py:args --workdir DIR

The config defaults to the run's own `config.json`; `--config` may replace it (e.g. to add
evaluators: only `evals` and the model must stay compatible with the checkpoint). Results are
printed as JSON and, with `--write`, appended to the run's metrics.jsonl and TensorBoard
events at the checkpoint's step, under the same `<eval name>/<metric>` names as in training.

Evaluating needs only what the evaluators read and the checkpoint's parameters: the training
split need not be prepared, and the optimizer state is not read. The data goes through the
run's input pipeline (`config.input.pipeline`: `--config.input.pipeline=memory` evaluates
without TensorFlow). The newest checkpoint is the newest readable one; unreadable newer steps
are skipped with a warning and left where they are.
"""
from __future__ import annotations

import json
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

import big_vision_relu  # noqa: F401  (quiets TensorFlow)
import jax
import ml_collections
from etils import epath

from big_vision_relu import checkpoint as ckpt_lib
from big_vision_relu import metrics as metrics_lib
from big_vision_relu import multihost
from big_vision_relu import run as run_lib
from big_vision_relu import sharding
from big_vision_relu import workdir_config


def evaluate(config: ml_collections.ConfigDict, checkpoint_dir: str, step: int | None = None,
             write_to: str | None = None) -> dict[str, Any]:
  """Restores the parameters of `step` (default: the newest readable) from `checkpoint_dir`
  and runs every evaluator of `config.evals`. Returns {'step': s, '<eval>/<metric>': value}."""
  run = run_lib.setup_evaluation(config)
  evaluators = run_lib.make_evaluators(run)
  if not evaluators:
    raise ValueError("config.evals is empty: nothing to evaluate.")
  step, params = _read_params(run, checkpoint_dir, step)
  results: dict[str, Any] = {"step": step}
  with jax.set_mesh(run.mesh):  # as in training: seq_parallel attention finds its axis there
    for evaluator in evaluators:
      for name, value in evaluator.run(params).items():
        results[f"{evaluator.name}/{name}"] = value
  if write_to is not None:
    with metrics_lib.MetricWriter(write_to) as writer:
      writer.write_scalars(step, {k: v for k, v in results.items() if k != "step"})
  return results


def _read_params(run: run_lib.EvalSetup, checkpoint_dir: str, step: int | None
                 ) -> tuple[int, Any]:
  """(step, params) of `step`, or of the newest step that reads, sharded as in training."""
  with ckpt_lib.Checkpointer(checkpoint_dir, save_interval_steps=1) as ckpt:
    steps = ckpt.all_steps()
    directory = ckpt.directory
  candidates = [step] if step is not None else steps[::-1]
  if not candidates:
    raise FileNotFoundError(f"No checkpoint in {checkpoint_dir}.")

  def shardings(abstract_params):
    return sharding.tree_shardings({"params": abstract_params}, run.config.sharding_strategy,
                                   run.mesh)["params"]
  for candidate in candidates:
    try:
      return candidate, ckpt_lib.read_params(directory / str(candidate), shardings)
    except (ValueError, OSError) as error:
      if step is not None:
        raise
      logging.warning("Could not read checkpoint step %d in %s (%s: %s); trying an older one.",
                      candidate, directory, type(error).__name__, error)
  raise RuntimeError(f"No checkpoint in {directory} could be read (steps {steps}).")


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
