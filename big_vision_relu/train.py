r"""Trains a ViT: one jitted update step over a device mesh; orbax checkpoints; metrics.jsonl.

    python -m big_vision_relu.train --config configs/local/mnist_relu.py --workdir /tmp/run

Re-running the same command resumes from the newest readable checkpoint in the workdir; a
different config stops before anything is written unless --allow_config_change (the workdir's
config_history.jsonl keeps every config it was run with: workdir_config.py).

Exit status: 0 when the run reached its last step (also a finished run re-run); 79
(`preemption.PREEMPTED_EXIT_CODE`, "saved, not finished") after SIGTERM (how TPU VMs announce a
preemption; launch/tpu/stop.sh sends it too): every process saved the same step, and re-running
the same command resumes; 75 (`multihost.PEER_LOST_EXIT_CODE`) when a peer process died
(below); anything else is an error (e.g. 1 on a non-finite loss).
Multi-host: on a TPU pod every worker runs the same command (`jax.distributed.initialize()` is
called automatically there); elsewhere pass --coordinator_address/--num_processes/--process_id.
Only process 0 writes metrics and config.json; all processes take part in checkpoints. If a
process dies, the others exit with status 75 and one line naming the checkpoint to resume from
(a multi-process run trains in a forked child, watched by the process started: multihost.py).

The workdir gets config.json, data_dir.json (the TFDS data dir it read), checkpoints/ (orbax),
metrics.jsonl and, where clu is installed, TensorBoard events. With
`config.input.pipeline='memory'` (e.g. `fmnist_vit.py:input=memory`) neither TensorFlow nor clu is
needed (docs/gpu.md).
"""
from __future__ import annotations

import sys

if __name__ == "__main__":
  # A multi-process run trains in a child process forked here, before JAX and TensorFlow are
  # imported; this process watches it, so that losing process 0 (the JAX coordinator) ends it
  # with one line naming the checkpoint to resume from (multihost.supervise).
  from big_vision_relu import multihost as _multihost
  _multihost.supervise(sys.argv[1:])

# The imports below come after the fork above.
# ruff: noqa: E402
import json
import logging as std_logging
import os
import time
from collections.abc import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

import big_vision_relu  # noqa: F401  (quiets TensorFlow before it is imported)
import jax
import ml_collections
from etils import epath

from big_vision_relu import checkpoint as ckpt_lib
from big_vision_relu import config as cfg_lib
from big_vision_relu import metrics as metrics_lib
from big_vision_relu import multihost as multihost_lib
from big_vision_relu import preemption
from big_vision_relu import run as run_lib
from big_vision_relu import workdir_config
from big_vision_relu.data import batching
from big_vision_relu.data import inputs
from big_vision_relu.models import vit

def train(config: ml_collections.ConfigDict, workdir: str,
          devices: Sequence[jax.Device] | None = None, *,
          allow_config_change: bool = False) -> dict[str, float]:
  """Runs (or resumes) training; returns the last logged metrics (train and evals), `step`
  (the last step), `start_step` (the checkpoint step it resumed from; 0 for a new run) and
  `preempted` (True: stopped by a preemption notice before the last step, saved).

  `devices` (default: all) are the devices of the mesh, e.g. one device of a host with eight.
  `allow_config_change`: continue a workdir whose config.json differs from `config` (e.g. more
  steps); otherwise that stops before anything is written.
  """
  # The workdir records the config as given (unset placeholders dropped), not filled in: a
  # default changed in the code later does not make its config.json differ.
  config_json = cfg_lib.without_unset(config).to_json_best_effort(indent=2)
  # A workdir holding another config stops the run here, before set-up reads datasets and
  # compiles; it is recorded only after set-up (_train), so a config that fails set-up leaves
  # nothing behind.
  workdir_config.use_config(workdir, config_json, allow_change=allow_config_change, write=False)
  # SIGTERM from here on saves and exits (main() installs it even earlier, before the job is
  # joined), so that a notice during set-up or compilation is not lost.
  with preemption.SigtermHandler():
    run = run_lib.setup(config, devices)
    with jax.set_mesh(run.mesh):
      return _train(run, workdir, config_json, allow_config_change)


def _train(run: run_lib.Setup, workdir: str, config_json: str,
           allow_config_change: bool = False) -> dict[str, float]:
  config, mesh, steps, schedules, state_shardings = (run.config, run.mesh, run.steps,
                                                     run.schedules, run.state_shardings)
  batch_size = config.input.batch_size
  evals = run_lib.make_evaluators(run)

  workdir_path = epath.Path(workdir)
  workdir_config.use_config(workdir_path, config_json, allow_change=allow_config_change,
                            write=jax.process_index() == 0)
  if jax.process_index() == 0:  # where the notebook finds the data (TFDS_DATA_DIR on a VM)
    workdir_config.record_data_dir(workdir_path)
  ckpt = ckpt_lib.Checkpointer(workdir_path / "checkpoints", save_interval_steps=steps["ckpt"],
                               keep_last=config.keep_last_ckpts,
                               keep_every_steps=config.keep_ckpt_steps)
  multihost_lib.set_checkpoint_dir(ckpt.directory)  # named if a peer process dies

  restored = ckpt.restore_latest(run.target)
  if restored is not None:
    state, start_step = restored.state, restored.step
    core_hours = float(restored.extra["core_hours"])
    logging.info("Resumed from step %d in %s", start_step, ckpt.directory)
  else:
    state = jax.jit(run.init_state, out_shardings=state_shardings)(
        jax.random.PRNGKey(config.seed))
    start_step, core_hours = 0, 0.0
    if config.model_init:
      params = vit.load(state["params"], config.model_init, config.model,
                        dont_load=config.model_load.dont_load)
      state["params"] = jax.device_put(params, state_shardings["params"])

  update = run.update
  batches = inputs.training_batches(config.input, seed=config.seed, start_step=start_step,
                                   process_index=jax.process_index(),
                                   process_count=jax.process_count())
  writer = metrics_lib.MetricWriter(workdir)
  # The paper's unit is the TensorCore: on v4 / v5p one device is a chip of two.
  cores = jax.device_count() * metrics_lib.tensorcores_per_device(jax.devices()[0].device_kind)
  progress = metrics_lib.Progress(total_steps=steps["total"], first_step=start_step,
                                  num_devices=cores, examples_per_step=batch_size,
                                  core_hours=core_hours,
                                  core_clock=(time.process_time
                                              if jax.default_backend() == "cpu" else None))
  logged: dict[str, float] = {}

  def save(step, force=False):
    if force or ckpt.should_save(step):
      run_lib.check_nonfinite(state, ckpt)
      with progress.paused(wait_for=state):
        ckpt.save(step, state, {"core_hours": progress.core_hours(), "data_position": step},
                  force=force)

  def run_evals(step) -> bool:
    due = [e for e in evals if e.due(step)]
    if not due:  # called every step: no sync with the device unless an evaluation runs
      return False
    with progress.paused(wait_for=state):
      for evaluator in due:
        values = {f"{evaluator.name}/{k}": v for k, v in evaluator.run(state["params"]).items()}
        writer.write_scalars(step, values)
        logged.update(values)
    return True

  step = start_step
  notice = preemption.PreemptionNotice(mesh.devices)
  try:
    with preemption.SigtermHandler():  # already entered by train(); harmless
      for step in range(start_step + 1, steps["total"] + 1):
        batch = batching.make_global_batch(next(batches), mesh, run_lib.DATA_AXIS)
        # The step's inputs are all device arrays: a stray numpy array or Python value reaching
        # it would fail here instead of silently transferring (on a pod, serialising the step).
        with jax.transfer_guard("disallow"):
          state, metrics = update(state, batch)
        log_now = step % steps["log"] == 0 or step in (steps["total"], start_step + 1)
        if log_now:
          run_lib.check_nonfinite(state, ckpt)
          values = {k: float(v) for k, v in jax.device_get(metrics).items()}
          for name, schedule in schedules.items():
            key = "lr" if len(schedules) == 1 else f"lr/{name}"
            values[key] = float(config.lr * schedule(step - 1))
          measured = progress.measure(step)
          if step == start_step + 1:  # this interval is mostly compilation: no throughput
            del measured["img/sec/core"]
          values.update(measured)
          writer.write_scalars(step, values)
          logged.update(values)
          logging.info("%s | loss %.4f", progress.line(step), values["training_loss"])
        if run_evals(step) or log_now:
          writer.flush()
        if notice.stop(step):
          logging.warning("Preemption notice (SIGTERM%s) at step %d: saving and exiting.",
                          " to this or another process" if jax.process_count() > 1 else "",
                          step)
          save(step, force=True)
          break
        save(step, force=step == steps["total"])
    notice.close()
  finally:
    batches.close()
    ckpt.wait_until_finished()  # a save in flight completes even when training failed
    ckpt.close()
    writer.close()
  logged["step"] = step
  logged["start_step"] = start_step
  logged["preempted"] = step < steps["total"]  # saved, not finished
  return logged


class _QuietLibraries(std_logging.Filter):
  """Drops orbax's, TFDS's and clu's INFO chatter (pages per checkpoint); keeps warnings."""
  NOISY = (f"{os.sep}orbax{os.sep}", f"{os.sep}tensorflow_datasets{os.sep}", f"{os.sep}clu{os.sep}",
           "xla_bridge.py")

  def filter(self, record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or not any(
        part in record.pathname for part in self.NOISY)


def main(argv: list[str]) -> None:
  del argv
  logging.get_absl_handler().addFilter(_QuietLibraries())
  if FLAGS.workdir is None:
    raise app.UsageError("--workdir is required.")
  with preemption.SigtermHandler():
    multihost_lib.initialize_from_flags(FLAGS)
    # A dead peer: one line, then exit (multi-process only).
    with multihost_lib.PeerWatchdog(timeout=FLAGS.peer_timeout_s):
      result = train(FLAGS.config, FLAGS.workdir,
                     allow_config_change=FLAGS.allow_config_change)
    if jax.process_index() == 0:
      print(json.dumps(result, indent=1, sort_keys=True), flush=True)
    multihost_lib.leave()  # every process together, not at interpreter exit
  if result["preempted"]:
    sys.exit(preemption.PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  config_flags.DEFINE_config_file("config", None, "Training config file (file.py:args).",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory (local or gs://); re-use to resume.")
  flags.DEFINE_bool("allow_config_change", False,
                    "Continue a workdir whose config.json differs from --config (e.g. more "
                    "steps); without it such a re-run stops before writing anything.")
  flags.DEFINE_float("peer_timeout_s", 60.0,
                     "Multi-process: a peer silent this long is taken for dead (one line, exit "
                     f"75); below JAX's own {multihost_lib.HEARTBEAT_TIMEOUT_SECONDS} s.",
                     lower_bound=1.0, upper_bound=multihost_lib.HEARTBEAT_TIMEOUT_SECONDS - 10)
  multihost_lib.define_flags()
  app.run(main)
