"""What both input pipelines (tf.data: `input_pipeline`; in memory: `memory_pipeline`) share:
the host's share of a global batch, the eval shares and their padding, global arrays.

Training: process h of P gets rows [h * B/P, (h + 1) * B/P) of every global batch of B.
Evaluation: process h reads its contiguous share of the split's records (like
`tfds.even_splits(split, P)[h]`: sizes differ by at most one, the first n % P shares are one
larger), in order, once; every process yields `num_eval_steps(...)` batches, padded after its
real examples; `_mask` (bool [batch]) tells real examples from padding and `_record` (int32) is
an example's record number in the split (-1 for padding), so results gathered from any number
of hosts can be put back in the split's order.
Global arrays: host batches become `jax.Array`s sharded on the leading (batch) axis over the
mesh's data axis, via `jax.make_array_from_process_local_data`.

numpy and jax only: no TensorFlow.
"""
from collections.abc import Mapping

import jax
import numpy as np

MASK_KEY = "_mask"
RECORD_KEY = "_record"


def host_batch_size(global_batch_size: int, process_count: int) -> int:
  """global_batch_size / process_count (ValueError unless it divides evenly)."""
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise ValueError(f"The global batch size {global_batch_size} must be a positive multiple "
                     f"of the number of processes ({process_count}); change input.batch_size.")
  return global_batch_size // process_count


def check_process(process_index: int, process_count: int) -> None:
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} is not in [0, {process_count})")


def eval_share(num_examples: int, process_index: int, process_count: int) -> tuple[int, int]:
  """[start, stop) of this process's records: even sizes, the first n % P one larger."""
  base, extra = divmod(num_examples, process_count)
  start = process_index * base + min(process_index, extra)
  return start, start + base + (process_index < extra)


def num_eval_steps(num_examples: int, global_batch_size: int, process_count: int) -> int:
  """Steps every process runs to see its whole eval share (the largest one, ceil(n / P))."""
  host_batch = host_batch_size(global_batch_size, process_count)
  largest_share = -(-num_examples // process_count)
  return max(1, -(-largest_share // host_batch))


def make_global_batch(host_batch: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh,
                      data_axis: str | tuple[str, ...] = "data") -> dict[str, jax.Array]:
  """Host-local arrays [b, ...] -> global jax.Arrays [b * process_count, ...].

  The leading axis is sharded over the mesh axis (or axes) `data_axis`; other axes are
  replicated. Each process passes its own rows, e.g. a batch from `training_batches`.
  """
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(data_axis))
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in host_batch.items()}
