"""The run layer: a config -> its model, mesh, optimizer, state, training step and evaluators.

What `train`, `evaluate`, `inspect` and the experiment tooling all need, built one way:
`setup(config)` validates the config and returns a `Setup` (nothing touches a checkpoint or a
workdir here), whose `config` is the one that runs: every key of `config.TRAIN_SCHEMA` filled
in, so the code below reads attributes, never defaults of its own. `make_update_fn` is the
training step, the one function a reader needs for what a step does; `make_evaluators` builds
the config's evaluators for a `Setup`, or for an `EvalSetup` (`setup_evaluation`: what
evaluating a checkpoint needs, without the training data or the optimizer).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import big_vision_relu  # noqa: F401  (quiets TensorFlow before it is imported)
import jax
import jax.numpy as jnp
import ml_collections
import optax

from big_vision_relu import checkpoint as ckpt_lib
from big_vision_relu import config as cfg_lib
from big_vision_relu import losses
from big_vision_relu import optim
from big_vision_relu import sharding
from big_vision_relu.data import batching
from big_vision_relu.data import inputs
from big_vision_relu.data.mixup import mixup
from big_vision_relu.evaluators import registry as evaluators
from big_vision_relu.models import attention as attn
from big_vision_relu.models import vit

DATA_AXIS = cfg_lib.DATA_AXIS


def make_model(config: ml_collections.ConfigDict) -> vit._Model:  # noqa: SLF001
  """The ViT of `config.model` (its keywords) with `config.num_classes` outputs (a filled
  config, or one as written, e.g. a workdir's config.json)."""
  try:
    model = vit.Model(config.get("num_classes"), **config.model)
  except TypeError as e:
    options = [f.name for f in dataclasses.fields(vit._Model)  # noqa: SLF001
               if f.name not in ("parent", "name", "num_classes", "attention_options")]
    options += attn.CONFIG_KEYS  # the flat keys `vit.Model` turns into attention_options
    raise ValueError(f"Bad config.model: {e}. Valid options: variant, "
                     f"{', '.join(options)}.") from None
  model.validate()
  return model


def _tree_l2(tree: Any) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32)))
                      for x in jax.tree.leaves(tree)))


def make_update_fn(model: vit._Model, tx: optax.GradientTransformation,  # noqa: SLF001
                   config: ml_collections.ConfigDict) -> Callable[..., tuple[dict, dict]]:
  """The training step `update(state, batch) -> (state, metrics)` of a filled `config` (its
  loss and mixup), to be jitted.

  state: {params, opt_state, step, rng, nonfinite_step}; batch: {image [b, h, w, c],
  labels [b, classes]}. `nonfinite_step` records the first step whose loss or gradients were
  not finite (-1: none), so the host can stop before checkpointing broken parameters without
  syncing on every step.
  """
  def update(state, batch):
    step_rng = jax.random.fold_in(state["rng"], state["step"])
    mixup_rng, dropout_rng = jax.random.split(step_rng)
    images, labels = batch["image"], batch["labels"]
    if config.mixup.p:
      images, labels = mixup(mixup_rng, (images, labels), p=config.mixup.p,
                             fold_in=config.mixup.fold_in)

    def loss_fn(params):
      logits, _ = model.apply({"params": params}, images, train=True,
                              rngs={"dropout": dropout_rng})
      return jnp.mean(losses.per_example_loss(logits, labels, config.loss))

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


def resolve_durations(config: ml_collections.ConfigDict,
                       steps_per_epoch: float) -> dict[str, int]:
  """The steps of the run, between training logs and between checkpoints of a filled config."""
  kw = dict(steps_per_epoch=steps_per_epoch, batch_size=config.input.batch_size, required=True)
  total = cfg_lib.get_steps(config, "total", total_steps=None, **kw)
  return dict(total=total, log=cfg_lib.get_steps(config, "log_training", total_steps=total, **kw),
              ckpt=cfg_lib.get_steps(config, "ckpt", total_steps=total, **kw))


def check_nonfinite(state: Mapping[str, Any], ckpt: ckpt_lib.Checkpointer) -> None:
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
  config: ml_collections.ConfigDict  # the one that runs: every key filled in (TRAIN_SCHEMA)
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
  """Validates `config`, fills in its defaults and builds the model, mesh, optimizer and
  (abstract) state."""
  config = cfg_lib.validate_train_config(config)
  pipeline = config.input.pipeline
  # Every missing dataset in one message, before any is opened (a paper config reads 11).
  inputs.check_prepared(inputs.required_datasets(config), pipeline)
  mesh = sharding.make_mesh(config.mesh, devices)
  batch_size = config.input.batch_size
  if batch_size % mesh.shape[DATA_AXIS]:
    raise ValueError(f"input.batch_size={batch_size} is not divisible by the {DATA_AXIS!r} "
                     f"mesh axis ({mesh.shape[DATA_AXIS]} devices); pick a multiple.")
  batching.host_batch_size(batch_size, jax.process_count())
  model = make_model(config)
  attention = model.attention_options
  if (attention.impl == "seq_parallel" and attention.mesh is None
      and attention.seq_axis not in mesh.axis_names):
    raise ValueError(f"attention_impl='seq_parallel' splits the sequence over the mesh axis "
                     f"{attention.seq_axis!r}, which config.mesh={config.mesh} lacks; use e.g. "
                     f"config.mesh=[('data', 2), ('{attention.seq_axis}', 4)].")
  steps_per_epoch = inputs.num_examples(config.input.data, pipeline) / batch_size
  steps = resolve_durations(config, steps_per_epoch)

  # The shapes of the images come from the pp (tfds: one example of the stream gives them).
  image_shape = inputs.training_image_shape(config.input, config.seed,
                                            process_index=jax.process_index(),
                                            process_count=jax.process_count())
  dummy_images = jnp.zeros((1, *image_shape), jnp.float32)

  def init_params(rng):
    params = model.init(rng, dummy_images)["params"]
    if config.init_head_bias is not None and "head" in params:
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

  with jax.set_mesh(mesh):
    abstract_state = jax.eval_shape(init_state, jax.random.PRNGKey(0))
  state_shardings = sharding.tree_shardings(abstract_state, config.sharding_strategy, mesh)
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract_state, state_shardings)
  compiler_options = _checked_compiler_options(config)
  step = make_update_fn(model, tx, config)
  # The memory pipeline's batches are raw: its pp (augmentation in JAX) runs first, in the step.
  if (preprocess := inputs.step_preprocess_fn(config.input, config.seed)) is not None:
    step = _preprocessed(step, preprocess)
  update = jax.jit(step, in_shardings=(state_shardings, None),
                   out_shardings=(state_shardings, None), donate_argnums=(0,),
                   compiler_options=compiler_options)
  return Setup(config=config, model=model, mesh=mesh, steps=steps,
               steps_per_epoch=steps_per_epoch, tx=tx, schedules=schedules,
               init_state=init_state, state_shardings=state_shardings, target=target,
               update=update)


def _preprocessed(update: Callable[..., tuple[dict, dict]],
                  preprocess: Callable[[dict], dict]) -> Callable[..., tuple[dict, dict]]:
  """`update(state, preprocess(batch))`: the training step of a raw batch."""
  def update_raw(state, batch):
    return update(state, preprocess(batch))
  return update_raw


@dataclasses.dataclass
class EvalSetup:
  """What evaluating a checkpoint derives from its config: no training data, no optimizer."""
  config: ml_collections.ConfigDict  # filled in, as Setup's
  model: vit._Model  # noqa: SLF001
  mesh: jax.sharding.Mesh


def setup_evaluation(config: ml_collections.ConfigDict,
                     devices: Sequence[jax.Device] | None = None) -> EvalSetup:
  """Validates `config` and builds its model and mesh; checks only the datasets its
  evaluators read (the training split need not be prepared)."""
  config = cfg_lib.validate_train_config(config)
  inputs.check_prepared(inputs.required_datasets(config, training=False), config.input.pipeline)
  return EvalSetup(config=config, model=make_model(config),
                   mesh=sharding.make_mesh(config.mesh, devices))


def _checked_compiler_options(config: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """config.xla_compiler_options (XLA debug options for the training step's compilation, e.g.
  {'xla_cpu_experimental_ynn_fusion_type': ''}: docs/benchmarks.md), tried on a tiny function
  now so that a misspelt name or a bad value fails before the run starts, not at step 1."""
  options = dict(config.xla_compiler_options)
  if not options:
    return None
  try:
    jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.zeros(())).compile()
  except jax.errors.JaxRuntimeError as error:
    raise ValueError(f"XLA ({jax.default_backend()}) rejects config.xla_compiler_options="
                     f"{options}: {error}") from error
  return options


def make_evaluators(run: Setup | EvalSetup) -> list[evaluators.ScheduledEvaluator]:
  """The evaluators of `run.config.evals`, given the run's model, mesh and input pipeline; with
  their cadence for a training `Setup`, without (run once) for an `EvalSetup`."""
  training = isinstance(run, Setup)
  return evaluators.from_config(
      run.config.evals, model=run.model, mesh=run.mesh, data_axis=DATA_AXIS,
      pipeline=run.config.input.pipeline,
      total_steps=run.steps["total"] if training else None,
      steps_per_epoch=run.steps_per_epoch if training else None,
      train_batch_size=run.config.input.batch_size, default_loss=run.config.loss)
