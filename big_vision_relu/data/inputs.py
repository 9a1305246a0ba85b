"""The two input pipelines behind one interface, chosen by `config.input.pipeline`:

  tfds    any TFDS dataset through tf.data (`input_pipeline`, `datasets`): records read by
          number, the pp on the host's CPUs in TensorFlow
  memory  the offline datasets (fashion_mnist_local, mnist5k, digits) as numpy arrays
          (`arrays`, `memory_pipeline`), the pp in JAX on the device (`jax_pp`): no TensorFlow

Both give the example at global position step * batch + i as a pure function of (seed,
position), each process its own rows of every global batch, and evaluators the same padded,
masked eval batches. The training and eval data of a run go through the same pipeline.

TensorFlow and TFDS are imported inside the functions below, only for the tfds pipeline, so
that the trainer, the evaluators and `evaluate` run where TensorFlow is not installed.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from big_vision_relu.data import arrays
from big_vision_relu.data import batching
from big_vision_relu.data import fashion_mnist
from big_vision_relu.data import holdout
from big_vision_relu.data import memory_pipeline

PIPELINES = ("tfds", "memory")
TRAIN_KEYS = ("image", "labels")  # what the training step reads: the training pp must make them


def required_datasets(config: Mapping[str, Any], *, training: bool = True
                      ) -> list[tuple[str, str | None]]:
  """(name, data_dir) of every dataset a config reads, in config order, once each:
  `input.data` (unless not `training`: evaluating a checkpoint), each `evals.<name>.data`, and
  each few-shot evaluator's `datasets` (with its `data_dir`)."""
  found: dict[tuple[str, str | None], None] = {}
  data = (config.get("input") or {}).get("data")
  if training and data and data.get("name"):
    found[(data["name"], data.get("data_dir"))] = None
  for evaluator in (config.get("evals") or {}).values():
    data = evaluator.get("data")
    if data and data.get("name"):
      found[(data["name"], data.get("data_dir"))] = None
    for spec in (evaluator.get("datasets") or {}).values():
      found[(spec[0], evaluator.get("data_dir"))] = None
  return list(found)


def check_prepared(names: Sequence[tuple[str, str | None]], pipeline: str) -> None:
  """Raises one error naming every dataset of `names` the pipeline cannot read, with the fix
  (tfds: datasets.check_prepared; memory: unknown names, missing Fashion-MNIST files)."""
  if pipeline == "tfds":
    from big_vision_relu.data import datasets  # TFDS
    datasets.check_prepared(names)
    return
  problems = []
  for name, data_dir in dict.fromkeys(names):
    try:
      arrays.check_name(name)
      if name == fashion_mnist.NAME:
        fashion_mnist.check_sources(data_dir or fashion_mnist.DEBIAN_DIR)
    except (ValueError, fashion_mnist.SourceError) as error:
      problems.append(f"- {error}")
  if problems:
    raise FileNotFoundError(
        f"{len(problems)} of the datasets this run reads cannot be read in memory:\n"
        + "\n".join(problems))


def num_examples(data: Mapping[str, Any], pipeline: str) -> int:
  """Examples in `data['split']` (TFDS split syntax), or in its `holdout` part."""
  if pipeline == "tfds":
    from big_vision_relu.data import datasets  # TFDS
    return datasets.num_examples(data)
  holdout.check_spec("data.holdout", data.get("holdout"))
  return len(arrays.load(data))


def num_classes(name: str, data_dir: str | None, pipeline: str) -> int:
  """The number of classes of a dataset's `label`."""
  if pipeline == "tfds":
    from big_vision_relu.data import datasets  # TFDS
    return datasets.get_builder(name, data_dir).info.features["label"].num_classes
  arrays.check_name(name)
  return arrays.NUM_CLASSES


class _TrainKeys:
  """The tf.data training batches, with only the keys the step reads."""

  def __init__(self, batches):
    self._batches = batches

  def __iter__(self) -> _TrainKeys:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = next(self._batches)
    return {k: batch[k] for k in TRAIN_KEYS}

  def close(self) -> None:
    self._batches.close()


def training_batches(input_config: Mapping[str, Any], *, seed: int, start_step: int,
                     process_index: int, process_count: int, prefetch: int | None = None):
  """Endless host-local training batches of `config.input` (filled) from `start_step`, with
  `close()`: tfds: {image, labels} after the pp; memory: raw features and `_position`, which
  the jitted step turns into {image, labels} (`step_preprocess_fn`)."""
  if input_config["pipeline"] == "tfds":
    from big_vision_relu.data import input_pipeline  # TensorFlow
    return _TrainKeys(input_pipeline.training_batches(
        input_config["data"], input_config["pp"], input_config["batch_size"], seed=seed,
        start_step=start_step, process_index=process_index, process_count=process_count,
        prefetch=input_config["prefetch"] if prefetch is None else prefetch))
  return memory_pipeline.TrainingBatches(
      input_config["data"], input_config["batch_size"], seed=seed, start_step=start_step,
      process_index=process_index, process_count=process_count)


def step_preprocess_fn(input_config: Mapping[str, Any], seed: int
                       ) -> Callable[[Mapping[str, jax.Array]], dict] | None:
  """What the training step applies to a global batch first (jitted with it): the memory
  pipeline's pp, to {image, labels}; None for tfds (its batches are preprocessed)."""
  if input_config["pipeline"] == "tfds":
    return None
  pp = memory_pipeline.preprocess_fn(input_config["pp"], seed=seed)

  def preprocess(batch: Mapping[str, jax.Array]) -> dict:
    out = pp(batch)
    if not set(TRAIN_KEYS) <= set(out):
      raise ValueError(f"input.pp {input_config['pp']!r} makes {sorted(out)}; the training "
                       f"step needs {', '.join(TRAIN_KEYS)}.")
    return {k: out[k] for k in TRAIN_KEYS}
  return preprocess


def training_image_shape(input_config: Mapping[str, Any], seed: int, *, process_index: int,
                         process_count: int) -> tuple[int, ...]:
  """[h, w, c] of one preprocessed training image (what the model is built for)."""
  if input_config["pipeline"] == "tfds":
    probe = training_batches(input_config, seed=seed, start_step=0, process_index=process_index,
                             process_count=process_count, prefetch=1)
    try:
      return tuple(next(probe)["image"].shape[1:])
    finally:
      probe.close()
  shapes = memory_pipeline.raw_shapes(input_config["data"], input_config["batch_size"])
  return tuple(jax.eval_shape(step_preprocess_fn(input_config, seed), shapes)["image"].shape[1:])


class EvalData:
  """One eval split with its (deterministic) pp, as global batches sharded over `data_axis`.

  Built once per evaluator: it checks the data now (`num_examples`); the memory pipeline keeps
  its arrays and its jitted pp, the tfds one its tf.data graph. Iterating is one pass: every
  process yields the same number of batches (the last ones padded; `_mask` False), each
  contributing its share of the split (batching.py).
  """

  def __init__(self, data: Mapping[str, Any], pp: str, batch_size: int, *, pipeline: str,
               mesh: jax.sharding.Mesh, data_axis: str | tuple[str, ...]):
    self.data, self.pp, self.batch_size, self.pipeline = dict(data), pp, batch_size, pipeline
    self.mesh, self.data_axis = mesh, data_axis
    self.num_examples = num_examples(self.data, pipeline)  # fails now if the data is missing
    self._kw = dict(process_index=jax.process_index(), process_count=jax.process_count())
    if pipeline == "memory":
      self._preprocess = jax.jit(memory_pipeline.preprocess_fn(pp, seed=None))
    else:  # traced once (~0.3 s of a core), not at every evaluation
      from big_vision_relu.data import input_pipeline  # TensorFlow
      self._dataset = input_pipeline.eval_dataset(self.data, self.pp, self.batch_size,
                                                  **self._kw)

  def __iter__(self) -> Iterator[dict[str, jax.Array]]:
    if self.pipeline == "tfds":
      from big_vision_relu.data import input_pipeline
      batches = input_pipeline.Batches(self._dataset)
      try:
        for host_batch in batches:
          yield batching.make_global_batch(host_batch, self.mesh, self.data_axis)
      finally:
        batches.close()
      return
    for host_batch in memory_pipeline.eval_batches(self.data, self.batch_size, **self._kw):
      yield self._preprocess(batching.make_global_batch(host_batch, self.mesh, self.data_axis))
