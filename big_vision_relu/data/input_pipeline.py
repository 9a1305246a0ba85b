"""The tf.data input pipeline (TFDS datasets): resumable training batches, padded eval batches.

Training (`training_batches`)
-----------------------------
The example at global position p = step * global_batch_size + i (i = row in the global batch)
is a pure function of (seed, p):

    n = number of records in the split,  epoch = p // n,  offset = p % n
    record = index_shuffle(offset, seed=fold_in((seed, 0), epoch), max_index=n - 1)
    _rng   = fold_in((seed, 1), p)          # per-example seed for the random pp ops

`tf.random.experimental.index_shuffle` is a stateless bijection of 0..n-1, so every epoch is a
fresh permutation of the whole split (a true global shuffle, no shuffle buffer) and epochs
follow each other exactly at multiples of n, also in the middle of a batch. Process h of P
reads rows [h * B/P, (h + 1) * B/P) of every global batch, records fetched by number.

What this buys:
- resuming at step s is O(1): the pipeline restarts at s and yields exactly the batches the
  uninterrupted run saw from step s; there is no iterator state to checkpoint (the step is
  enough) and nothing to skip over, for 13M-image ImageNet-21k as for MNIST;
- memory per host is O(batch) regardless of the dataset size;
- the global batches do not depend on the number of processes: a run resumed on a pod slice
  of a different size sees the same examples at every step (only their split over hosts
  changes).

(The host share is thus a share of every global batch, not `tfds.even_splits` of the records
as in big_vision: that would tie the data order to the number of processes.)

What it costs:
- datasets must be stored as ArrayRecord (`python -m big_vision_relu.data.prepare` builds
  them so; `python -m big_vision_relu.data.convert` converts datasets already built as TFRecord,
  without apache-beam): random access by record
  number is impossible with TFRecord files. `datasets.raw_record_source` says so, with the
  command, when a dataset is in another format;
- every example is a separate random read. On local disk that is cheap; on GCS each read
  has tens of ms of latency, so throughput comes from parallelism: each host batch is fetched
  with one `__getitems__` call, which ArrayRecord serves with one thread per shard touched (at
  most 64: its `grain_num_threads_fetching_records` flag), and the next batch is fetched while
  the current one is preprocessed. A host reads records from all shards, not 1/P of them;
- records are fetched by a Python callback (`tf.numpy_function`), so the pipeline cannot be
  serialised to the tf.data service and the fetch itself holds the GIL between reads.

Decoding (`tf.train.Example` parsing, image decoding in the `decode` op) and all pp ops run
inside the tf.data graph, in parallel. Image features are not decoded by TFDS: the pp string's
`decode` (or `decode_jpeg_and_inception_crop`) does it, as in big_vision.

Evaluation (`eval_batches`)
---------------------------
Process h reads its contiguous share of the records, in order, once (`batching`: the shares,
the number of steps and `make_global_batch` are the in-memory pipeline's too). After the real
examples come padding examples, all zeros with the shapes and dtypes of a preprocessed example,
and `_mask` (bool [batch]) tells them apart. The eval pp runs on real examples only (and once
on the split's first example, to get the shapes of the padding).
"""
import atexit
import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from big_vision_relu.data import datasets
from big_vision_relu.data import holdout
# The host shares, eval padding and global arrays are the in-memory pipeline's too.
from big_vision_relu.data.batching import (MASK_KEY, RECORD_KEY, check_process,  # noqa: F401
                                           eval_share, host_batch_size, make_global_batch,
                                           num_eval_steps)
from big_vision_relu.data import pp as pp_lib

# Stream tags folded into the user's seed, so the shuffle and the augmentation use unrelated
# random numbers.
_SHUFFLE_STREAM, _AUGMENT_STREAM = 0, 1


class Batches:
  """Numpy batches of a tf.data pipeline, shut down before the interpreter exits.

  The pipelines read records through a Python callback (`tf.numpy_function`). A tf.data
  iterator destroyed during interpreter finalisation waits for its in-flight callbacks, which
  can no longer take the GIL: the process hangs at exit. So every open `Batches` is closed by
  an atexit hook (which runs before finalisation), and callers may `close()` earlier.
  """

  def __init__(self, ds: tf.data.Dataset):
    self._iterator = ds.as_numpy_iterator()
    _OPEN_BATCHES.add(self)

  def __iter__(self) -> "Batches":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._iterator is None:
      raise StopIteration
    return next(self._iterator)

  def close(self) -> None:
    """Destroys the tf.data iterator now (idempotent)."""
    self._iterator = None


_OPEN_BATCHES: "weakref.WeakSet[Batches]" = weakref.WeakSet()
atexit.register(lambda: [batches.close() for batches in list(_OPEN_BATCHES)])


class _Records:
  """The records `numbers` (ascending) of a random-access `source`, renumbered 0..k-1."""

  def __init__(self, source: Sequence[bytes], numbers: np.ndarray):
    self._source, self._numbers = source, numbers

  def __len__(self) -> int:
    return len(self._numbers)

  def __getitems__(self, indices: Sequence[int]) -> Sequence[bytes]:
    return self._source.__getitems__(self._numbers[np.asarray(indices, np.int64)].tolist())


def _labels(source: Sequence[bytes], deserialize: Callable[[tf.Tensor], dict],
            key: str) -> np.ndarray:
  """The `key` feature of every record of `source`, in record order (int64 `[n]`)."""
  ds = _map(tf.data.Dataset.range(len(source)).batch(1024), lambda r: _fetch(source, r))
  ds = _map(ds.unbatch(), lambda s: deserialize(s)[key], num_parallel_calls=tf.data.AUTOTUNE)
  return np.concatenate(list(ds.batch(4096).as_numpy_iterator())).astype(np.int64)


@functools.lru_cache(maxsize=8)
def _holdout_numbers(name: str, split: str, data_dir: str | None, num_examples: int, seed: int,
                     part: str, rest_examples: int | None = None) -> np.ndarray:
  """Record numbers of a holdout part (data/holdout.py), from the split's labels (read once per
  process: the trainer and its validation evaluator share them)."""
  source, deserialize = _open(dict(name=name, split=split, data_dir=data_dir))
  builder = datasets.get_builder(name, data_dir)
  labels = _labels(source, deserialize, datasets.label_key(builder))
  spec = dict(num_examples=num_examples, seed=seed, part=part)
  return holdout.records(labels, spec if rest_examples is None else
                         dict(spec, rest_examples=rest_examples))


def _open(data: Mapping[str, Any]) -> tuple[Sequence[bytes], Callable[[tf.Tensor], dict]]:
  """Returns (raw records of the split, or of its holdout part; deserializer: scalar tf.string
  -> feature dict)."""
  datasets.check_data_spec(data)
  builder = datasets.get_builder(data["name"], data.get("data_dir"))
  source = datasets.raw_record_source(builder, data["split"])
  if len(source) == 0:
    raise ValueError(f"Split {data['split']!r} of {data['name']} has no examples")
  features = builder.info.features
  # Images stay encoded: the pp string decodes them (and may crop while decoding JPEGs).
  decoders = {k: tfds.decode.SkipDecoding() for k in features.keys()
              if isinstance(features[k], tfds.features.Image)}

  def deserialize(serialized: tf.Tensor) -> dict:
    return features.deserialize_example(serialized, decoders=decoders)
  if (spec := data.get("holdout")) is not None:
    numbers = _holdout_numbers(data["name"], data["split"], data.get("data_dir"),
                               spec["num_examples"], spec["seed"], spec["part"],
                               spec.get("rest_examples"))
    source = _Records(source, numbers)
  return source, deserialize


def _map(ds: tf.data.Dataset, fn: Callable, **kwargs) -> tf.data.Dataset:
  """`ds.map(fn, **kwargs)` without autograph. This module's functions (and the pp ops) have no
  Python control flow over tensors; autograph's re-parse of their source costs time at every
  start (see pp/registry.py), and once lost a lambda's closure (NameError: 'num_padding')."""
  return ds.map(tf.autograph.experimental.do_not_convert(fn), **kwargs)


def _fetch(source: Sequence[bytes], records: tf.Tensor) -> tf.Tensor:
  """Serialized records [k] (tf.string) for record numbers `records` (int64 [k]).

  One batched `__getitems__` call: ArrayRecord reads the shards involved in parallel threads.
  Callers run one fetch at a time (no sequential map parallelism) so that the readers are
  never used from two tf.data threads at once.
  """
  def read(numbers: np.ndarray) -> np.ndarray:
    return np.array(source.__getitems__(numbers.tolist()), dtype=object)
  serialized = tf.numpy_function(read, [records], tf.string)
  serialized.set_shape(records.shape)
  return serialized


def training_batches(data: Mapping[str, str], pp: str, global_batch_size: int, *, seed: int,
                     start_step: int = 0, process_index: int, process_count: int,
                     prefetch: int = 2) -> Batches:
  """Endless host-local training batches, starting at `start_step` (see the module docstring).

  Args:
    data: {'name': TFDS name, 'split': TFDS split (slicing allowed), 'data_dir': optional}.
    pp: pp string applied to each example (random ops draw from its `_rng`).
    global_batch_size: examples per step over all processes.
    seed: the run's data seed; with `data`, `pp` and the batch size it fixes every batch.
    start_step: first step to yield (the checkpointed step when resuming).
    process_index, process_count: this process and the number of processes.
    prefetch: host batches prepared ahead.

  Yields:
    dicts of numpy arrays with leading dim global_batch_size / process_count: the pp output
    keys (`_rng` removed).
  """
  check_process(process_index, process_count)
  host_batch = host_batch_size(global_batch_size, process_count)
  if start_step < 0:
    raise ValueError(f"start_step must be >= 0, got {start_step}")
  preprocess = pp_lib.get_preprocess_fn(pp)
  source, deserialize = _open(data)
  n = len(source)
  shuffle_key = tf.constant([seed, _SHUFFLE_STREAM], tf.int64)
  augment_key = tf.constant([seed, _AUGMENT_STREAM], tf.int64)

  def locate(local_position: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """This process's k-th example -> (record number, per-example seed int64 [2])."""
    step, row = local_position // host_batch, local_position % host_batch
    position = step * global_batch_size + process_index * host_batch + row
    epoch_key = tf.random.experimental.stateless_fold_in(shuffle_key, position // n)
    record = tf.random.experimental.index_shuffle(position % n, seed=epoch_key,
                                                  max_index=tf.constant(n - 1, tf.int64))
    return record, tf.random.experimental.stateless_fold_in(augment_key, position)

  def process(serialized: tf.Tensor, rng: tf.Tensor) -> dict:
    example = preprocess({**deserialize(serialized), pp_lib.RNG_KEY: rng})
    return {k: v for k, v in example.items() if k != pp_lib.RNG_KEY}

  ds = _map(tf.data.Dataset.counter(start=start_step * host_batch, dtype=tf.int64), locate)
  # One read call per host batch, made one batch ahead while the previous one is preprocessed.
  ds = _map(ds.batch(host_batch), lambda records, rngs: (_fetch(source, records), rngs))
  ds = _map(ds.prefetch(1).unbatch(), process, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(host_batch, drop_remainder=True).prefetch(prefetch)
  return Batches(ds)


def eval_batches(data: Mapping[str, str], pp: str, global_batch_size: int, *,
                 process_index: int, process_count: int, prefetch: int = 2) -> Batches:
  """One pass of `eval_dataset` (same arguments)."""
  return Batches(eval_dataset(data, pp, global_batch_size, process_index=process_index,
                              process_count=process_count, prefetch=prefetch))


def eval_dataset(data: Mapping[str, str], pp: str, global_batch_size: int, *,
                 process_index: int, process_count: int,
                 prefetch: int = 2) -> tf.data.Dataset:
  """This process's share of the split, padded to `num_eval_steps` batches; each iteration
  is one pass (an evaluator builds it once and iterates it at every evaluation).

  Args:
    data: {'name', 'split', 'data_dir' (optional)} as for `training_batches`.
    pp: deterministic pp string; all its outputs must have the same shapes.
    global_batch_size, process_index, process_count, prefetch: as for `training_batches`.

  Yields (as numpy, through `Batches`):
    dicts of arrays with leading dim global_batch_size / process_count: the pp output
    keys, plus `_mask` (bool): True for real examples, False for zero padding, and `_record`
    (int32): the example's record number in the split, -1 for padding.
  """
  check_process(process_index, process_count)
  host_batch = host_batch_size(global_batch_size, process_count)
  preprocess = pp_lib.get_preprocess_fn(pp)
  source, deserialize = _open(data)
  start, stop = eval_share(len(source), process_index, process_count)
  num_padding = (num_eval_steps(len(source), global_batch_size, process_count) * host_batch
                 - (stop - start))

  def read(records: tf.data.Dataset) -> tf.data.Dataset:
    ds = _map(records.batch(host_batch), lambda r: (r, _fetch(source, r))).prefetch(1)
    return _map(
        ds.unbatch(),
        lambda r, s: {**preprocess(deserialize(s)), RECORD_KEY: tf.cast(r, tf.int32)},
        num_parallel_calls=tf.data.AUTOTUNE)

  real = read(tf.data.Dataset.range(start, stop))
  # Padding copies the shapes of the split's first example (known also to processes whose
  # share is empty), zeroed; one extra read per pass, and no need for static pp shapes.
  @tf.autograph.experimental.do_not_convert  # as in _map
  def zero_copies(example: dict) -> tf.data.Dataset:
    zeros = {**tf.nest.map_structure(tf.zeros_like, example), MASK_KEY: False, RECORD_KEY: -1}
    return tf.data.Dataset.from_tensors(zeros).repeat(num_padding)

  padding = read(tf.data.Dataset.range(1)).flat_map(zero_copies)
  real = _map(real, lambda example: {**example, MASK_KEY: True})
  return real.concatenate(padding).batch(host_batch, drop_remainder=True).prefetch(prefetch)
