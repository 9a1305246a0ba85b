"""Evaluators: hand-computed classification sums, padding and sharding, the few-shot evaluator
against the probe on directly-read arrays, the i21k->i1k restriction, the registry filling and
checking every evaluator's config before any data is read and handing each evaluator the
model, and the evaluate CLI (also where the training split is not prepared)."""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from big_vision_relu import config as cfg_lib
from big_vision_relu import evaluate as evaluate_lib
from big_vision_relu import run as run_lib
from big_vision_relu import sharding
from big_vision_relu import train as train_lib
from big_vision_relu.data import datasets as datasets_lib
from big_vision_relu.data import label_maps
from big_vision_relu.evaluators import classification, fewshot, registry
from big_vision_relu.evaluators.fewshot_evaluator import FewShotEvaluator

from conftest import FAST_COMPILE, ROOT
from trainer_processes import tiny_config

MESH8 = sharding.make_mesh([("data", -1)])


class FunctionModel:
  """Stands in for the ViT where an evaluator applies it: `apply({'params': p}, images,
  train=False)` returns `(logits, out)`, here with `out[name] = fn(p, images)` for each of
  `outputs`."""

  def __init__(self, **outputs):
    self.outputs = outputs

  def apply(self, variables, images, train):
    assert not train
    out = {name: fn(variables["params"], images) for name, fn in self.outputs.items()}
    return out.get("logits"), out


def test_batch_sums_hand_computed():
  logits = jnp.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 5.0], [9.0, 0.0, 0.0]])
  labels = jnp.array([[1.0, 0.0, 0.0],   # argmax 0: correct
                      [1.0, 0.0, 1.0],   # multi-hot {0, 2}, argmax 1: wrong
                      [0.0, 1.0, 1.0],   # multi-hot {1, 2}, argmax 2: correct
                      [0.0, 1.0, 0.0]])  # padding: ignored
  mask = jnp.array([True, True, True, False])
  sums = classification.batch_sums(logits, labels, mask, loss_name="sigmoid_xent")
  assert float(sums["correct"]) == 2.0 and float(sums["count"]) == 3.0
  x, y = np.asarray(logits[:3], np.float64), np.asarray(labels[:3])
  sigmoid_xent = -(y * np.log(1 / (1 + np.exp(-x))) + (1 - y) * np.log(1 - 1 / (1 + np.exp(-x))))
  np.testing.assert_allclose(float(sums["loss"]), sigmoid_xent.sum(), rtol=1e-6)
  sums = classification.batch_sums(logits, labels, mask, loss_name="softmax_xent")
  log_softmax = x - np.log(np.exp(x).sum(-1, keepdims=True))
  expected = -(y / y.sum(-1, keepdims=True) * log_softmax).sum()
  np.testing.assert_allclose(float(sums["loss"]), expected, rtol=1e-6)


def test_label_map_restricts_the_argmax_to_imagenet1k_classes():
  indices = label_maps.i21k_to_i1k_indices()
  assert indices[850] == -1  # teddy bear: no ImageNet-21k class
  i1k = set(indices[indices >= 0].tolist())
  outside = next(i for i in range(21843) if i not in i1k)
  logits = np.zeros((2, 21843), np.float32)
  logits[:, outside] = 100.0          # the unrestricted argmax is not an i1k class
  logits[0, indices[7]] = 5.0         # example 0: i1k class 7 is the best i1k class
  logits[1, indices[3]] = 5.0
  logits[1, 21842] = 50.0             # what a raw gather with -1 would pick for class 850
  labels = np.zeros((2, 1000), np.float32)
  labels[0, 7] = 1.0
  labels[1, 850] = 1.0                # a teddy bear: can never be predicted
  sums = classification.batch_sums(jnp.asarray(logits), jnp.asarray(labels),
                                    jnp.array([True, True]), loss_name="softmax_xent",
                                    label_map=indices)
  assert float(sums["correct"]) == 1.0
  assert np.isfinite(float(sums["loss"]))


def _digits_arrays(data_dir, split):
  """The split read with plain TFDS, in record order: (images [n, 8, 8, 1] float, labels)."""
  ds = tfds.data_source("digits", split=split, data_dir=data_dir)
  examples = [ds[i] for i in range(len(ds))]
  images = np.stack([e["image"] for e in examples]).astype(np.float32) / 127.5 - 1.0
  return images, np.array([e["label"] for e in examples])


def test_classification_evaluator_on_8_devices_with_padding(offline_data_dir):
  weights = jax.random.normal(jax.random.PRNGKey(0), (64, 10))
  predict = lambda params, images: images.reshape(images.shape[0], -1) @ params  # noqa: E731
  config = dict(type="classification", data=dict(name="digits", split="test",
                                                 data_dir=offline_data_dir),
                pp_fn='decode(channels=1)|value_range(-1, 1)|onehot(10)|keep("image", "labels")',
                batch_size=48)  # 359 examples: 8 batches, the last padded
  evaluator = classification.ClassificationEvaluator(
      registry.evaluator_config(config, "evals.test"), model=FunctionModel(logits=predict),
      mesh=MESH8, pipeline="tfds", default_loss="softmax_xent")  # loss_name unset: the run's
  result = evaluator.run(weights)
  images, labels = _digits_arrays(offline_data_dir, "test")
  logits = images.reshape(len(images), -1) @ np.asarray(weights, np.float64)
  assert result["num_examples"] == 359
  np.testing.assert_allclose(result["prec@1"], np.mean(logits.argmax(-1) == labels), atol=1e-9)
  log_softmax = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                keepdims=True)) - logits.max(-1, keepdims=True)
  np.testing.assert_allclose(result["loss"], -log_softmax[np.arange(359), labels].mean(),
                             rtol=1e-4)


def test_fewshot_evaluator_equals_the_probe_on_directly_read_features(offline_data_dir):
  pp = 'decode(channels=1)|value_range(-1, 1)|keep("image", "label")'
  config = dict(type="fewshot", datasets={"digits": ("digits", "train", "test")},
                data_dir=offline_data_dir, pp_train=pp, pp_eval=pp, shots=(5, 10),
                seeds=(0, 1), batch_size=40)
  predict = lambda params, images: images.reshape(images.shape[0], -1) * params  # noqa: E731
  evaluator = FewShotEvaluator(registry.evaluator_config(config, "evals.fewshot"),
                               model=FunctionModel(pre_logits=predict), mesh=MESH8,
                               pipeline="tfds")
  result = evaluator.run(jnp.float32(2.0))
  x_train, y_train = _digits_arrays(offline_data_dir, "train")
  x_test, y_test = _digits_arrays(offline_data_dir, "test")
  expected = fewshot.fewshot_results(2.0 * x_train.reshape(len(x_train), -1), y_train,
                                     2.0 * x_test.reshape(len(x_test), -1), y_test,
                                     name="digits", num_classes=10, shots=(5, 10), seeds=(0, 1))
  expected.update(fewshot.fewshot_average(expected, ["digits"], shots=(5, 10)))
  assert set(result) == set(expected)
  for key, value in expected.items():
    assert result[key] == pytest.approx(value, abs=1e-6), key
  assert result["10shot_avg"] == result["digits_10shot"] > 0.5


def test_missing_fewshot_dataset_fails_at_construction(offline_data_dir):
  config = dict(type="fewshot", datasets={"cifar": ("cifar100", "train", "test")},
                data_dir=offline_data_dir, pp_train="decode", pp_eval="decode", batch_size=8)
  with pytest.raises(FileNotFoundError, match="prepare --download --datasets=cifar100"):
    FewShotEvaluator(registry.evaluator_config(config, "evals.fewshot"),
                     model=FunctionModel(pre_logits=lambda p, x: x), mesh=MESH8,
                     pipeline="tfds")


NO_CADENCE = dict(log_steps=None, log_epochs=None, log_examples=None, log_percent=None)
DIGITS = dict(name="digits", split="test")


def test_the_registry_gives_every_evaluator_the_model(monkeypatch):
  built = []

  class Recorder:
    CONFIG_SCHEMA = {"pred": cfg_lib.Key("logits")}

    def __init__(self, config, *, model, mesh, data_axis, pipeline, default_loss):
      built.append(dict(config=dict(config), model=model, mesh=mesh, data_axis=data_axis,
                        pipeline=pipeline, default_loss=default_loss))

  monkeypatch.setitem(registry.EVALUATORS, "recorder", Recorder)
  model = FunctionModel()
  evals = {"a": dict(type="recorder"), "b": dict(type="recorder", pred="pre_logits")}
  scheduled = registry.from_config(evals, model=model, mesh=MESH8, data_axis="data",
                                   pipeline="memory", total_steps=10, steps_per_epoch=2.0,
                                   train_batch_size=8, default_loss="softmax_xent")
  assert [e.name for e in scheduled] == ["a", "b"]
  filled = [dict(type="recorder", pred="logits", **NO_CADENCE),  # pred unset: the default
            dict(type="recorder", pred="pre_logits", **NO_CADENCE)]
  assert built == [dict(config=cfg, model=model, mesh=MESH8, data_axis="data",
                        pipeline="memory", default_loss="softmax_xent") for cfg in filled]


@pytest.mark.parametrize("given,expected", [
    (dict(type="classification", data=DIGITS, pp_fn="decode", batch_size=8, label_map=None),
     dict(type="classification", data=dict(DIGITS, data_dir=None, holdout=None), pp_fn="decode",
          batch_size=8, loss_name=None, label_map=None, pred="logits", **NO_CADENCE)),
    (dict(type="fewshot", datasets={"digits": ("digits", "train", "test")}, pp_train="a",
          pp_eval="b", batch_size=8, seeds=[3], data_dir=None, log_steps=5),
     dict(type="fewshot", datasets={"digits": ("digits", "train", "test")}, data_dir=None,
          pp_train="a", pp_eval="b", shots=(10,), seeds=[3], l2_reg=1024.0,
          loo_l2_grid=tuple(2.0**i for i in range(-10, 21)), pred="pre_logits", batch_size=8,
          **dict(NO_CADENCE, log_steps=5))),
    (dict(type="attention_stats", data=DIGITS, pp_fn="decode", batch_size=8),
     dict(type="attention_stats", data=dict(DIGITS, data_dir=None, holdout=None), pp_fn="decode",
          batch_size=8, num_examples=128, **NO_CADENCE)),
], ids=["classification", "fewshot", "attention_stats"])
def test_unset_keys_take_exactly_the_schema_defaults(given, expected):
  filled = registry.evaluator_config(ml_collections.ConfigDict(given), "evals.x")
  assert filled.to_dict() == expected  # None given (label_map, data_dir) reads as unset
  if given["type"] == "fewshot":
    assert type(filled.shots) is tuple and type(filled.loo_l2_grid) is tuple


GOOD = dict(type="classification", data=DIGITS, pp_fn="decode", batch_size=8)
PROBE = dict(type="fewshot", datasets={"digits": ("digits", "train", "test")}, pp_train="decode",
             pp_eval="decode", batch_size=8)
ATTENTION = dict(type="attention_stats", data=DIGITS, pp_fn="decode", batch_size=8)


@pytest.mark.parametrize("bad,match", [
    (dict(GOOD, bogus=1), r"Unknown key\(s\) in evals\.bad: bogus\. Valid keys: batch_size, "),
    (dict(GOOD, type="bogus"), r"evals\.bad\.type='bogus'; valid: classification, fewshot"),
    (dict(GOOD, batch_size=-1), r"evals\.bad\.batch_size=-1 must be a positive int"),
    (dict(GOOD, batch_size=None), r"evals\.bad\.batch_size is required: a positive int"),
    ({k: v for k, v in GOOD.items() if k != "pp_fn"},
     r"evals\.bad\.pp_fn is required: a pp string producing `image` and one-hot `labels`"),
    (dict(GOOD, data=dict(name="digits")), r"evals\.bad\.data\.split is required: a TFDS split"),
    (dict(GOOD, data=dict(DIGITS, spilt="x")), r"Unknown key\(s\) in evals\.bad\.data: spilt"),
    (dict(GOOD, loss_name="mse"), r"evals\.bad\.loss_name='mse' must be one of sigmoid_xent"),
    (dict(GOOD, label_map="i21k_to_i2k"),
     r"evals\.bad\.label_map='i21k_to_i2k' must be i21k_to_i1k or imagenet21k/<release>"),
    (dict(GOOD, log_steps=0), r"evals\.bad\.log_steps=0 must be a positive number"),
    (dict(PROBE, shots=(0,)), r"evals\.bad\.shots=\(0,\) must be a non-empty tuple of positive"),
    (dict(PROBE, shots=()), r"evals\.bad\.shots=\(\) must be a non-empty tuple of positive"),
    (dict(PROBE, seeds=(0, 1.5)), r"evals\.bad\.seeds=\(0, 1\.5\) must be a non-empty tuple of "
                                  "ints >= 0"),
    (dict(PROBE, l2_reg=0.0), r"evals\.bad\.l2_reg=0\.0 must be a finite number > 0"),
    (dict(PROBE, loo_l2_grid=(1.0, -1.0)), r"evals\.bad\.loo_l2_grid=\(1\.0, -1\.0\) must be"),
    (dict(PROBE, datasets={"digits": ("digits", "train")}),
     r"evals\.bad\.datasets=.* must be a non-empty dict \{short_name: \(tfds_name, train_split"),
    ({k: v for k, v in PROBE.items() if k != "datasets"}, r"evals\.bad\.datasets is required"),
    (dict(ATTENTION, num_examples=0), r"evals\.bad\.num_examples=0 must be a positive int"),
    (dict(GOOD, log_steps=2, log_percent=0.5),
     r"Contradictory durations in evals\.bad: set only one of log_steps, log_percent"),
    ("classification", r"evals\.bad must be a dict with a 'type' \(classification, fewshot"),
])
def test_a_bad_evaluator_config_fails_before_any_dataset_is_read(monkeypatch, bad, match):
  def read(*args, **kwargs):
    raise AssertionError("a dataset was read before every evaluator config was checked")
  monkeypatch.setattr(datasets_lib, "get_builder", read)
  build = lambda evals: registry.from_config(  # noqa: E731
      evals, model=FunctionModel(), mesh=MESH8, data_axis="data", pipeline="tfds",
      total_steps=10, steps_per_epoch=2.0, train_batch_size=8, default_loss="softmax_xent")
  with pytest.raises(ValueError, match=match):
    build({"good": GOOD, "bad": bad})
  with pytest.raises(AssertionError, match="a dataset was read"):  # the guard guards
    build({"good": GOOD})


def test_evaluate_cli_on_a_trained_workdir(offline_data_dir, tmp_path):
  config = tiny_config(offline_data_dir, total_steps=2)
  config.evals = ml_collections.ConfigDict({"test": dict(
      type="classification", data=dict(name="mnist5k", split="test[:40]",
                                       data_dir=offline_data_dir),
      pp_fn=config.input.pp, batch_size=16)})
  logged = train_lib.train(config, str(tmp_path / "run"))
  out = subprocess.run(
      # --nomultihost: evaluate takes the trainer's multi-process flags (a single host never joins).
      [sys.executable, "-m", "big_vision_relu.evaluate", "--workdir", str(tmp_path / "run"),
       "--write", "--nomultihost"], capture_output=True, text=True, cwd=ROOT, timeout=300,
      env={**__import__("os").environ,
           "XLA_FLAGS": f"--xla_force_host_platform_device_count=1 {FAST_COMPILE}"})
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout[out.stdout.index("{"):])
  assert result["step"] == 2
  assert result["test/num_examples"] == 40
  assert result["test/prec@1"] == pytest.approx(logged["test/prec@1"], abs=1e-6)
  assert result["test/loss"] == pytest.approx(logged["test/loss"], rel=1e-5)
  last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
  assert last["step"] == 2 and last["test/prec@1"] == result["test/prec@1"]

  # Where the training split is not prepared (issue 87), the checkpoint still evaluates:
  # `evaluate` checks and reads only the evaluators' datasets, and restores the parameters
  # alone (another optimizer's state does not matter); the trainer's set-up refuses the config.
  elsewhere = config.copy_and_resolve_references()
  elsewhere.input.data = dict(name="imagenet2012", split="train",
                              data_dir=str(tmp_path / "no_data_here"))
  elsewhere.total_steps, elsewhere.total_epochs = None, 90  # its length needs the split's size
  elsewhere.optax_name, elsewhere.optax = "trace", dict(decay=0.9)  # another opt_state
  with pytest.raises(datasets_lib.DatasetNotPreparedError, match="'imagenet2012' is not prep"):
    run_lib.setup(elsewhere)
  again = evaluate_lib.evaluate(elsewhere, str(tmp_path / "run" / "checkpoints"))
  assert again["step"] == 2 and again["test/num_examples"] == 40
  assert again["test/prec@1"] == result["test/prec@1"]  # on 8 devices here, 1 in the CLI
  assert again["test/loss"] == pytest.approx(result["test/loss"], rel=1e-5)

