"""Input pipelines: determinism, resumption, host shares, epochs, eval padding."""
import pathlib

import numpy as np
import pytest
import tensorflow_datasets as tfds

from big_vision_relu.data import datasets
from big_vision_relu.data import inputs
from big_vision_relu.data import input_pipeline as ip

# Cheap pp that identifies each example by its source row.
INDEX_PP = 'decode(1)|keep("index")'


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """The digits dataset, built on first use (test_data_builders checks the building)."""
  tfds.disable_progress_bar()
  path = str(tmp_path_factory.getbasetemp() / "tfds_offline")
  datasets.get_builder("digits", path)
  return path


def spec(data_dir, name="digits", split="train"):
  return {"name": name, "split": split, "data_dir": data_dir}


def take(iterator, num_steps):
  return [next(iterator) for _ in range(num_steps)]


def split_indices(data_dir, name, split):
  """Source rows of a split in TFDS record order."""
  source = tfds.builder(name, data_dir=data_dir).as_data_source(split)
  return np.array([e["index"] for e in source.__getitems__(list(range(len(source))))])


def test_same_seed_same_batches_and_resume_with_augmentation(data_dir):
  # randaug's determinism is tested in test_data_randaug (its graph takes seconds to trace).
  pp = ('decode|inception_crop(6)|flip_lr|value_range(-1, 1)|onehot(10)|'
        'keep("image", "labels", "index")')
  kwargs = dict(seed=7, process_index=0, process_count=1)
  full = take(ip.training_batches(spec(data_dir), pp, 16, **kwargs), 4)
  resumed = take(ip.training_batches(spec(data_dir), pp, 16, start_step=2, **kwargs), 2)
  assert full[0]["image"].shape == (16, 6, 6, 3) and full[0]["labels"].shape == (16, 10)
  assert set(full[0]) == {"image", "labels", "index"}
  for a, b in zip(full[2:], resumed):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_same_seed_same_stream_other_seed_other_stream(data_dir):
  def stream(seed, start_step=0):
    it = ip.training_batches(spec(data_dir), INDEX_PP, 32, seed=seed, start_step=start_step,
                             process_index=0, process_count=1)
    return np.stack([b["index"] for b in take(it, 5)])
  first = stream(0)
  np.testing.assert_array_equal(first, stream(0))
  assert not np.array_equal(first, stream(1))
  np.testing.assert_array_equal(stream(0, start_step=50)[:1],
                                stream(0, start_step=49)[1:2])


def test_epochs_are_fresh_permutations_with_exact_boundaries(data_dir):
  n = datasets.num_examples(spec(data_dir))  # 1438: epochs end in the middle of a batch.
  it = ip.training_batches(spec(data_dir), INDEX_PP, 64, seed=3, process_index=0,
                           process_count=1)
  positions = np.concatenate([b["index"] for b in take(it, 2 * n // 64 + 1)])
  train_rows = np.sort(split_indices(data_dir, "digits", "train"))
  epoch0, epoch1 = positions[:n], positions[n:2 * n]
  np.testing.assert_array_equal(np.sort(epoch0), train_rows)
  np.testing.assert_array_equal(np.sort(epoch1), train_rows)
  assert not np.array_equal(epoch0, epoch1)
  # Resuming in epoch 1 (step 25 starts at position 1600) continues the same permutation.
  resumed = ip.training_batches(spec(data_dir), INDEX_PP, 64, seed=3, start_step=25,
                                process_index=0, process_count=1)
  np.testing.assert_array_equal(next(resumed)["index"], positions[1600:1664])


def test_process_shares_are_disjoint_cover_an_epoch_and_form_the_global_batch(data_dir):
  n, steps = 1438, 1438 // 64 + 1
  single = take(ip.training_batches(spec(data_dir), INDEX_PP, 64, seed=5, process_index=0,
                                    process_count=1), steps)
  hosts = [take(ip.training_batches(spec(data_dir), INDEX_PP, 64, seed=5, process_index=h,
                                    process_count=2), steps) for h in range(2)]
  for step in range(steps):
    assert hosts[0][step]["index"].shape == (32,)
    # Process h holds rows [32h, 32h + 32) of the global batch, whatever the process count.
    np.testing.assert_array_equal(
        np.concatenate([hosts[0][step]["index"], hosts[1][step]["index"]]),
        single[step]["index"])
  # Global positions of each host's examples: step * 64 + 32 * h + row.
  first_epoch = []
  for h in range(2):
    rows = np.concatenate([b["index"] for b in hosts[h]])
    positions = (np.arange(steps)[:, None] * 64 + 32 * h + np.arange(32)).ravel()
    first_epoch.append(rows[positions < n])
  assert not set(first_epoch[0]) & set(first_epoch[1])
  np.testing.assert_array_equal(np.sort(np.concatenate(first_epoch)),
                                np.sort(split_indices(data_dir, "digits", "train")))


def test_sliced_splits_are_the_index_space(data_dir):
  it = ip.training_batches(spec(data_dir, split="train[:100]"), INDEX_PP, 50, seed=0,
                           process_index=0, process_count=1)
  seen = np.concatenate([b["index"] for b in take(it, 2)])
  np.testing.assert_array_equal(np.sort(seen),
                                np.sort(split_indices(data_dir, "digits", "train[:100]")))


@pytest.mark.parametrize("process_count, global_batch", [(1, 100), (3, 48)])
def test_eval_batches_pad_with_masked_zeros(data_dir, process_count, global_batch):
  pp = 'decode|value_range(0, 1)|onehot(10)|keep("image", "labels", "index")'
  n = datasets.num_examples(spec(data_dir, split="test"))
  steps = ip.num_eval_steps(n, global_batch, process_count)
  host_batch = global_batch // process_count
  seen = []
  for h, share in enumerate(tfds.even_splits("test", process_count)):
    batches = list(ip.eval_batches(spec(data_dir, split="test"), pp, global_batch,
                                   process_index=h, process_count=process_count))
    assert len(batches) == steps
    mask = np.concatenate([b[ip.MASK_KEY] for b in batches])
    assert mask.dtype == bool and mask.shape == (steps * host_batch,)
    real = int(mask.sum())
    assert mask[:real].all() and not mask[real:].any()  # Real examples first, in order.
    index = np.concatenate([b["index"] for b in batches])
    np.testing.assert_array_equal(index[:real], split_indices(data_dir, "digits", share))
    images = np.concatenate([b["image"] for b in batches])
    assert images.shape == (steps * host_batch, 8, 8, 3)
    assert not images[real:].any() and not index[real:].any()
    seen.append(index[:real])
  assert sum(map(len, seen)) == n == 359
  np.testing.assert_array_equal(np.sort(np.concatenate(seen)),
                                np.sort(split_indices(data_dir, "digits", "test")))


def test_num_eval_steps():
  assert ip.num_eval_steps(359, 48, 3) == 8    # Shares 120/120/119, 16 per host and step.
  assert ip.num_eval_steps(100, 10, 1) == 10
  assert ip.num_eval_steps(1, 8, 4) == 1


def test_clear_errors(data_dir):
  with pytest.raises(ValueError, match="multiple of the number of processes"):
    ip.training_batches(spec(data_dir), INDEX_PP, 30, seed=0, process_index=0, process_count=4)
  with pytest.raises(ValueError, match="process_index"):
    ip.eval_batches(spec(data_dir), INDEX_PP, 32, process_index=2, process_count=2)
  with pytest.raises(ValueError, match="_rng"):
    next(ip.eval_batches(spec(data_dir), "decode|flip_lr", 32, process_index=0,
                         process_count=1))
  with pytest.raises(datasets.DatasetNotPreparedError):
    ip.training_batches(spec(data_dir, name="cifar10"), INDEX_PP, 32, seed=0, process_index=0,
                        process_count=1)


def test_one_check_lists_every_missing_dataset_with_its_command(tmp_path):
  """The paper's configs read 11 datasets: all the missing ones in one message, each with the
  command that prepares it; offline ones are built on the way."""
  import importlib.util

  datasets_lib = datasets
  path = pathlib.Path(__file__).resolve().parents[1] / "configs/vit_i21k.py"
  spec = importlib.util.spec_from_file_location("vit_i21k", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("")
  names = inputs.required_datasets(config)
  assert names[0][0] == "imagenet21k" and len(names) == 10  # + imagenet2012 and 8 few-shot
  assert {"imagenet2012", "cars196", "caltech_birds2011", "uc_merced"} <= {n for n, _ in names}
  data_dir = str(tmp_path / "empty")
  with pytest.raises(datasets_lib.DatasetNotPreparedError) as error:
    datasets_lib.check_prepared([(n, data_dir) for n, _ in names] + [("digits", data_dir)])
  message = str(error.value)
  assert message.startswith(f"{len(names)} of the {len(names) + 1} datasets")
  for name, _ in names:
    assert f"Dataset {name!r} is not prepared" in message
  assert "python -m big_vision_relu.data.imagenet21k --release=fall2011 --data_dir=" in message
  assert (f"python -m big_vision_relu.data.prepare --datasets=cars196 "
          f"--manual_dir=DIR_WITH_THE_FILES --data_dir={data_dir}") in message
