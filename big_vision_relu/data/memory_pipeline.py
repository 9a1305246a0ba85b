"""The in-memory input pipeline: a split as numpy arrays on each host, its pp in JAX on the device.

For datasets that fit in host memory (the offline ones, `arrays`), on machines without
TensorFlow. Host work per step is an index lookup and a gather of raw uint8 rows; decoding is
done once (arrays), and the pp (`jax_pp`) runs on the device inside the jitted training step
(`run.setup`) or next to an evaluator's function.

Training (`TrainingBatches`): the contract of input_pipeline.training_batches. The example at
global position p = step * global_batch_size + i (i = row in the global batch) is a pure
function of (seed, p):

    n = examples in the split,  epoch = p // n,  offset = p % n
    record = permutation(seed, epoch)[offset]     # numpy RandomState seeded with (seed, 0, epoch)
    key    = jax_pp.example_keys(seed, p)          # the random pp ops' key, on the device

so every epoch is a fresh permutation of the whole split, epochs follow each other exactly at
multiples of n, and a run resumed at step s sees exactly the batches the uninterrupted run saw
(no iterator state: the step is enough). Process h of P yields rows [h * B/P, (h + 1) * B/P) of
every global batch, so the global batches do not depend on the number of processes. The order
differs from the tf.data path's (TF's index_shuffle is not available without TensorFlow);
quality does not (docs/benchmarks.md). `RandomState` because NumPy freezes its streams (NEP 19),
so a resumed run keeps its order across NumPy upgrades.

Why not grain's `MapDataset` (index shuffle, checkpointable iterators): this path must run
with jax, flax, optax, orbax, numpy and absl alone (the GPU machine has no more, and no network);
grain 0.2 adds array-record (C++), protobuf, cloudpickle and portpicker. What it would give is a
position -> record map and an iterator state, which here are one permutation per epoch and the
checkpointed step. (grain 0.2.18's `shuffle` also seeds epoch e with seed + e, so seed 1's
epoch 0 would be seed 0's epoch 1: the seeds of a study would share orders.)

Evaluation (`EvalBatches`): process h's contiguous share of the split's records, in order,
padded to `batching.num_eval_steps` batches with zero images, `_mask` and `_record` as on the
tf.data path (batching.py).

Host batches hold the raw features `image` (uint8 [b, h, w, c]) and `label` (int32 [b]), plus
`_position` (uint32 [b, 2], the hi and lo words of p) for training; `preprocess_fn` turns the
global batch into what the pp string makes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from big_vision_relu.data import arrays
from big_vision_relu.data import batching
from big_vision_relu.data import jax_pp

_SHUFFLE_STREAM = 0  # as input_pipeline's: the shuffle and the augmentation are unrelated


def _words(value: int) -> list[int]:
  """An int (any sign, < 2**63) as two uint32 words, hi and lo."""
  value %= 2**64
  return [value >> 32, value & 0xFFFFFFFF]


def epoch_permutation(seed: int, epoch: int, num_examples: int) -> np.ndarray:
  """The record order of one epoch: a permutation of 0..n-1 (int64), fixed by (seed, epoch)."""
  entropy = np.array([*_words(seed), _SHUFFLE_STREAM, *_words(epoch)], np.uint32)
  return np.random.RandomState(entropy).permutation(num_examples)


def _raw(split: arrays.Split, records: np.ndarray) -> dict[str, np.ndarray]:
  return {"image": split.images[records], "label": split.labels[records].astype(np.int32)}


class TrainingBatches:
  """Endless host-local training batches from `start_step` (see the module docstring).

  Args:
    data: {name, split[, data_dir][, holdout]} of an in-memory dataset (arrays.py).
    global_batch_size: examples per step over all processes.
    seed: the run's data seed; with `data` and the batch size it fixes every batch.
    start_step: first step to yield (the checkpointed step when resuming).
    process_index, process_count: this process and the number of processes.
  """

  def __init__(self, data: Mapping[str, Any], global_batch_size: int, *, seed: int,
               start_step: int = 0, process_index: int, process_count: int):
    batching.check_process(process_index, process_count)
    if start_step < 0:
      raise ValueError(f"start_step must be >= 0, got {start_step}")
    self._host_batch = batching.host_batch_size(global_batch_size, process_count)
    self._split = arrays.load(data)
    self._first_row = process_index * self._host_batch
    self._global_batch, self._seed, self._step = global_batch_size, seed, start_step
    self._orders: dict[int, np.ndarray] = {}  # epoch -> permutation; the epochs of one batch

  def __iter__(self) -> TrainingBatches:
    return self

  def positions(self, step: int) -> np.ndarray:
    """Global stream positions (int64 [host batch]) of this process's rows of `step`."""
    return (step * self._global_batch + self._first_row
            + np.arange(self._host_batch, dtype=np.int64))

  def __next__(self) -> dict[str, np.ndarray]:
    positions = self.positions(self._step)
    self._step += 1
    n = len(self._split)
    epochs, offsets = np.divmod(positions, n)
    self._orders = {int(e): self._orders.get(int(e)) for e in np.unique(epochs)}
    records = np.empty_like(positions)
    for epoch in self._orders:
      if self._orders[epoch] is None:
        self._orders[epoch] = epoch_permutation(self._seed, epoch, n)
      rows = epochs == epoch
      records[rows] = self._orders[epoch][offsets[rows]]
    words = np.stack([positions >> 32, positions & 0xFFFFFFFF], axis=1).astype(np.uint32)
    return {**_raw(self._split, records), "_position": words}

  def close(self) -> None:
    """Nothing to release (for the trainer's `finally`, as input_pipeline.Batches)."""


def eval_batches(data: Mapping[str, Any], global_batch_size: int, *, process_index: int,
                 process_count: int) -> Iterator[dict[str, np.ndarray]]:
  """One pass over this process's share of the split, padded to `num_eval_steps` batches:
  raw `image` and `label`, `_mask` (True: a real example) and `_record` (int32, -1: padding)."""
  batching.check_process(process_index, process_count)
  host_batch = batching.host_batch_size(global_batch_size, process_count)
  split = arrays.load(data)
  start, stop = batching.eval_share(len(split), process_index, process_count)
  for step in range(batching.num_eval_steps(len(split), global_batch_size, process_count)):
    records = np.arange(start + step * host_batch, start + (step + 1) * host_batch)
    real = records < stop
    raw = _raw(split, np.where(real, records, 0))
    raw = {k: np.where(real.reshape(-1, *[1] * (v.ndim - 1)), v, 0).astype(v.dtype)
           for k, v in raw.items()}
    yield {**raw, batching.MASK_KEY: real,
           batching.RECORD_KEY: np.where(real, records, -1).astype(np.int32)}


def preprocess_fn(pp: str, *, seed: int | None) -> Callable[[Mapping[str, jax.Array]], dict]:
  """The pp of a global batch of this pipeline (to jit): training (`seed` given) draws the
  random ops' keys from `_position` and drops it; evaluation (`seed` None) keeps `_mask` and
  `_record`."""
  if seed is None:
    return jax_pp.batch_preprocess_fn(pp, random=False)
  apply = jax_pp.batch_preprocess_fn(pp, random=True)

  def train(batch: Mapping[str, jax.Array]) -> dict:
    keys = jax_pp.example_keys(seed, batch["_position"])
    examples = {k: v for k, v in batch.items() if k != "_position"}
    return apply(examples, keys)
  return train


def raw_shapes(data: Mapping[str, Any], batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
  """Shapes and dtypes of a global training batch of raw features (for jax.eval_shape)."""
  split = arrays.load(data)
  return {"image": jax.ShapeDtypeStruct((batch_size, *split.images.shape[1:]), np.uint8),
          "label": jax.ShapeDtypeStruct((batch_size,), np.int32),
          "_position": jax.ShapeDtypeStruct((batch_size, 2), np.uint32)}
