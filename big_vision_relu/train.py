r"""Trains a ViT: one jitted update step over a device mesh; orbax checkpoints; clu metrics.

    python -m big_vision_relu.train --config configs/local/mnist_relu.py --workdir /tmp/run

Re-running the same command resumes from the newest readable checkpoint in the workdir; a
different config stops before anything is written unless --allow_config_change (the workdir's
config_history.jsonl keeps every config it was run with: workdir_config.py). On
SIGTERM (how TPU VMs announce preemption) the run saves a checkpoint and exits with status 0.
Multi-host: on a TPU pod every worker runs the same command (`jax.distributed.initialize()` is
called automatically there); elsewhere pass --coordinator_address/--num_processes/--process_id.
Only process 0 writes metrics and config.json; all processes take part in checkpoints.

The workdir gets config.json, checkpoints/ (orbax), metrics.jsonl and TensorBoard events.
"""
from __future__ import annotations

import dataclasses
import json
import logging as std_logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

import big_vision_relu  # noqa: F401  (quiets TensorFlow before it is imported)
import jax
import jax.numpy as jnp
import ml_collections
import optax
from etils import epath

from big_vision_relu import checkpoint as ckpt_lib
from big_vision_relu import config as cfg_lib
from big_vision_relu import metrics as metrics_lib
from big_vision_relu import multihost as multihost_lib
from big_vision_relu import optim
from big_vision_relu import sharding
from big_vision_relu import workdir_config
from big_vision_relu.data import datasets
from big_vision_relu.data import input_pipeline
from big_vision_relu.data.mixup import mixup
from big_vision_relu.evaluators import registry as evaluators
from big_vision_relu.evaluators.classification import per_example_loss
from big_vision_relu.models import vit

DATA_AXIS = "data"


def make_model(config: ml_collections.ConfigDict) -> vit._Model:  # noqa: SLF001
  """The ViT of `config.model` (its keywords) with `config.num_classes` outputs."""
  try:
    model = vit.Model(config.get("num_classes"), **config.model)
  except TypeError as e:
    options = [f.name for f in dataclasses.fields(vit._Model)  # noqa: SLF001
               if f.name not in ("parent", "name", "num_classes")]
    raise ValueError(f"Bad config.model: {e}. Valid options: variant, "
                     f"{', '.join(options)}.") from None
  model.validate()
  return model


def _tree_l2(tree: Any) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32)))
                      for x in jax.tree.leaves(tree)))


def make_update_fn(model: vit._Model, tx: optax.GradientTransformation,  # noqa: SLF001
                   config: ml_collections.ConfigDict) -> Callable[..., tuple[dict, dict]]:
  """The training step `update(state, batch) -> (state, metrics)`, to be jitted.

  state: {params, opt_state, step, rng, nonfinite_step}; batch: {image [b, h, w, c],
  labels [b, classes]}. `nonfinite_step` records the first step whose loss or gradients were
  not finite (-1: none), so the host can stop before checkpointing broken parameters without
  syncing on every step.
  """
  loss_name = config.get("loss", "sigmoid_xent")
  mixup_cfg = config.get("mixup")

  def update(state, batch):
    step_rng = jax.random.fold_in(state["rng"], state["step"])
    mixup_rng, dropout_rng = jax.random.split(step_rng)
    images, labels = batch["image"], batch["labels"]
    if mixup_cfg and mixup_cfg.get("p"):
      images, labels = mixup(mixup_rng, (images, labels), p=mixup_cfg["p"],
                             fold_in=mixup_cfg.get("fold_in"))

    def loss_fn(params):
      logits, _ = model.apply({"params": params}, images, train=True,
                              rngs={"dropout": dropout_rng})
      return jnp.mean(per_example_loss(logits, labels, loss_name))

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    l2_grads = _tree_l2(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(l2_grads)
    step = state["step"] + 1
    nonfinite_step = jnp.where((state["nonfinite_step"] < 0) & ~finite, step,
                               state["nonfinite_step"])
    new_state = dict(params=params, opt_state=opt_state, step=step, rng=state["rng"],
                     nonfinite_step=nonfinite_step)
    metrics = {"training_loss": loss, "l2_grads": l2_grads, "l2_params": _tree_l2(params),
               "l2_updates": _tree_l2(updates)}
    return new_state, metrics

  return update


def _resolve_durations(config: ml_collections.ConfigDict,
                       steps_per_epoch: float) -> dict[str, int]:
  kw = dict(steps_per_epoch=steps_per_epoch, batch_size=config.input.batch_size)
  total = cfg_lib.get_steps(config, "total", total_steps=None, required=True, **kw)
  log = cfg_lib.get_steps(config, "log_training", total_steps=total, **kw) or 50
  ckpt = cfg_lib.get_steps(config, "ckpt", total_steps=total, **kw) or total
  return dict(total=total, log=log, ckpt=ckpt)


def _check_nonfinite(state: Mapping[str, Any], ckpt: ckpt_lib.Checkpointer) -> None:
  bad = int(jax.device_get(state["nonfinite_step"]))
  if bad >= 0:
    good = ckpt.latest_step()
    raise FloatingPointError(
        f"Non-finite loss or gradients at step {bad}. Training stopped; the last good "
        f"checkpoint is {'step ' + str(good) if good is not None else 'none'} and was not "
        "touched. Lower config.lr, enable grad_clip_norm or qk_norm, or check the data.")


@dataclasses.dataclass
class Setup:
  """Everything a run derives from its config before touching a checkpoint."""
  model: vit._Model  # noqa: SLF001
  mesh: jax.sharding.Mesh
  steps: dict[str, int]  # total, log, ckpt
  steps_per_epoch: float
  tx: optax.GradientTransformation
  schedules: dict[str, Callable[[int], jax.Array]]
  init_state: Callable[[jax.Array], dict[str, Any]]  # rng -> state
  state_shardings: Any
  target: Any  # abstract state with shardings: what checkpoints restore into
  update: Callable[..., tuple[dict, dict]]  # the jitted make_update_fn; donates the state


def setup(config: ml_collections.ConfigDict,
          devices: Sequence[jax.Device] | None = None) -> Setup:
  """Validates `config` and builds the model, mesh, optimizer and (abstract) state."""
  config = cfg_lib.without_unset(config)
  cfg_lib.validate_train_config(config)
  # Every missing dataset in one message, before any is opened (a paper config reads 11).
  datasets.check_prepared(datasets.required_datasets(config))
  mesh = sharding.make_mesh(config.get("mesh", [(DATA_AXIS, -1)]), devices)
  if DATA_AXIS not in mesh.shape:
    raise ValueError(f"config.mesh needs a {DATA_AXIS!r} axis for the batch; got {config.mesh}.")
  batch_size = config.input.batch_size
  if batch_size % mesh.shape[DATA_AXIS]:
    raise ValueError(f"input.batch_size={batch_size} is not divisible by the {DATA_AXIS!r} "
                     f"mesh axis ({mesh.shape[DATA_AXIS]} devices); pick a multiple.")
  input_pipeline.host_batch_size(batch_size, jax.process_count())
  model = make_model(config)
  if (model.attention_impl == "seq_parallel" and model.mesh is None
      and model.seq_axis not in mesh.axis_names):
    raise ValueError(f"attention_impl='seq_parallel' splits the sequence over the mesh axis "
                     f"{model.seq_axis!r}, which config.mesh={config.get('mesh')} lacks; use e.g. "
                     f"config.mesh=[('data', 2), ('{model.seq_axis}', 4)].")
  steps_per_epoch = datasets.num_examples(config.input.data) / batch_size
  steps = _resolve_durations(config, steps_per_epoch)

  # The shapes of the images come from the pp; one example of the stream gives them.
  probe = input_pipeline.training_batches(
      config.input.data, config.input.pp, batch_size, seed=config.seed, start_step=0,
      process_index=jax.process_index(), process_count=jax.process_count(), prefetch=1)
  dummy_images = jnp.zeros((1, *next(probe)["image"].shape[1:]), jnp.float32)
  probe.close()

  def init_params(rng):
    params = model.init(rng, dummy_images)["params"]
    if config.get("init_head_bias") is not None and "head" in params:
      params["head"]["bias"] = jnp.full_like(params["head"]["bias"], config.init_head_bias)
    return params

  # The trainer's mesh is the context mesh wherever the model is traced (here, in `train` and in
  # `evaluate`), so attention_impl='seq_parallel' finds its sequence axis in config.mesh.
  with jax.set_mesh(mesh):
    abstract_params = jax.eval_shape(init_params, jax.random.PRNGKey(0))
  tx, schedules = optim.make_optimizer(config, abstract_params, steps["total"])

  def init_state(rng):
    params_rng, train_rng = jax.random.split(rng)
    params = init_params(params_rng)
    return dict(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32),
                rng=train_rng, nonfinite_step=jnp.full((), -1, jnp.int32))

  strategy = config.get("sharding_strategy", [(".*", "replicate")])
  with jax.set_mesh(mesh):
    abstract_state = jax.eval_shape(init_state, jax.random.PRNGKey(0))
  state_shardings = sharding.tree_shardings(abstract_state, strategy, mesh)
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract_state, state_shardings)
  compiler_options = _checked_compiler_options(config)
  update = jax.jit(make_update_fn(model, tx, config), in_shardings=(state_shardings, None),
                   out_shardings=(state_shardings, None), donate_argnums=(0,),
                   compiler_options=compiler_options)
  return Setup(model=model, mesh=mesh, steps=steps, steps_per_epoch=steps_per_epoch, tx=tx,
               schedules=schedules, init_state=init_state, state_shardings=state_shardings,
               target=target, update=update)


def _checked_compiler_options(config: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """config.xla_compiler_options (XLA debug options for the training step's compilation, e.g.
  {'xla_cpu_experimental_ynn_fusion_type': ''}: docs/benchmarks.md), tried on a tiny function
  now so that a misspelt name or a bad value fails before the run starts, not at step 1."""
  options = dict(config.get("xla_compiler_options") or {})
  if not options:
    return None
  try:
    jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.zeros(())).compile()
  except jax.errors.JaxRuntimeError as error:
    raise ValueError(f"XLA ({jax.default_backend()}) rejects config.xla_compiler_options="
                     f"{options}: {error}") from error
  return options


def make_evaluators(config: ml_collections.ConfigDict, run: Setup) -> list:
  return evaluators.from_config(
      config.get("evals", {}), model=run.model, mesh=run.mesh, data_axis=DATA_AXIS,
      total_steps=run.steps["total"], steps_per_epoch=run.steps_per_epoch,
      train_batch_size=config.input.batch_size,
      default_loss=config.get("loss", "sigmoid_xent"))


def train(config: ml_collections.ConfigDict, workdir: str,
          devices: Sequence[jax.Device] | None = None, *,
          allow_config_change: bool = False) -> dict[str, float]:
  """Runs (or resumes) training; returns the last logged metrics (train and evals), `step`
  (the last step) and `start_step` (the checkpoint step it resumed from; 0 for a new run).

  `devices` (default: all) are the devices of the mesh, e.g. one device of a host with eight.
  `allow_config_change`: continue a workdir whose config.json differs from `config` (e.g. more
  steps); otherwise that stops before anything is written.
  """
  config = cfg_lib.without_unset(config)  # unset placeholders read as missing keys
  # SIGTERM from here on saves and exits (main() installs it even earlier, before the job is
  # joined), so that a notice during set-up or compilation is not lost.
  with multihost_lib.SigtermHandler():
    run = setup(config, devices)
    with jax.set_mesh(run.mesh):
      return _train(config, workdir, run, allow_config_change)


def _train(config: ml_collections.ConfigDict, workdir: str, run: Setup,
           allow_config_change: bool = False) -> dict[str, float]:
  mesh, steps, schedules, state_shardings = (run.mesh, run.steps, run.schedules,
                                             run.state_shardings)
  batch_size = config.input.batch_size
  evals = make_evaluators(config, run)

  workdir_path = epath.Path(workdir)
  workdir_config.use_config(workdir_path, config.to_json_best_effort(indent=2),
                            allow_change=allow_config_change, write=jax.process_index() == 0)
  ckpt = ckpt_lib.Checkpointer(workdir_path / "checkpoints", save_interval_steps=steps["ckpt"],
                               keep_last=config.get("keep_last_ckpts", 2),
                               keep_every_steps=config.get("keep_ckpt_steps"))
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
    if config.get("model_init"):
      params = vit.load(state["params"], config.model_init, config.model,
                        dont_load=config.get("model_load", {}).get("dont_load", ()))
      state["params"] = jax.device_put(params, state_shardings["params"])

  update = run.update
  batches = input_pipeline.training_batches(
      config.input.data, config.input.pp, batch_size, seed=config.seed, start_step=start_step,
      process_index=jax.process_index(), process_count=jax.process_count(),
      prefetch=config.input.get("prefetch", 2))
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
      _check_nonfinite(state, ckpt)
      with progress.paused():
        ckpt.save(step, state, {"core_hours": progress.core_hours(), "data_position": step},
                  force=force)

  def run_evals(step) -> bool:
    due = [e for e in evals if e.due(step)]
    with progress.paused():
      for evaluator in due:
        values = {f"{evaluator.name}/{k}": v for k, v in evaluator.run(state["params"]).items()}
        writer.write_scalars(step, values)
        logged.update(values)
    return bool(due)

  step = start_step
  preemption = multihost_lib.PreemptionNotice(mesh.devices)
  try:
    with multihost_lib.SigtermHandler():  # already entered by train(); harmless
      for step in range(start_step + 1, steps["total"] + 1):
        host_batch = next(batches)
        batch = input_pipeline.make_global_batch(
            {k: host_batch[k] for k in ("image", "labels")}, mesh, DATA_AXIS)
        # The step's inputs are all device arrays: a stray numpy array or Python value reaching
        # it would fail here instead of silently transferring (on a pod, serialising the step).
        with jax.transfer_guard("disallow"):
          state, metrics = update(state, batch)
        log_now = step % steps["log"] == 0 or step in (steps["total"], start_step + 1)
        if log_now:
          _check_nonfinite(state, ckpt)
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
        if preemption.stop(step):
          logging.warning("Preemption notice (SIGTERM%s) at step %d: saving and exiting.",
                          " to this or another process" if jax.process_count() > 1 else "",
                          step)
          save(step, force=True)
          break
        save(step, force=step == steps["total"])
  finally:
    batches.close()
    ckpt.wait_until_finished()  # a save in flight completes even when training failed
    ckpt.close()
    writer.close()
  logged["step"] = step
  logged["start_step"] = start_step
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
  with multihost_lib.SigtermHandler():
    multihost_lib.initialize_from_flags(FLAGS)
    with multihost_lib.PeerWatchdog():  # a dead peer: one line, then exit (multi-process only)
      result = train(FLAGS.config, FLAGS.workdir,
                     allow_config_change=FLAGS.allow_config_change)
  if jax.process_index() == 0:
    print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  config_flags.DEFINE_config_file("config", None, "Training config file (file.py:args).",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory (local or gs://); re-use to resume.")
  flags.DEFINE_bool("allow_config_change", False,
                    "Continue a workdir whose config.json differs from --config (e.g. more "
                    "steps); without it such a re-run stops before writing anything.")
  multihost_lib.define_flags()
  app.run(main)
