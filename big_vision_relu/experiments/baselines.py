r"""Trivial baselines on a config's own data: what a trained model must beat to mean anything.

    python -m big_vision_relu.experiments.baselines --config configs/study/fmnist_vit.py \
        --seeds 0,1,2 --out results/fmnist/baselines.json

- Accuracy on each `classification` evaluator's split of two classifiers fitted on the whole
  training split of `config.input.data`: 1-nearest-neighbour (Euclidean) and a ridge classifier
  (scikit-learn's `KNeighborsClassifier(1)` and `RidgeClassifier(alpha=1)`), on raw pixels and
  on the `pre_logits` of the config's network at its random initialisation (the run's own
  `init_state` for each of `--seeds`, fed those pixels): what the architecture gives before any
  training, through the same two probes.
- Few-shot transfer, for each `fewshot` evaluator of the config: raw pixels, and the network at
  its random initialisation, through exactly that evaluator (same pp, subsets, seeds and l2).

Pixels go through `--pixel_pp` (decoded and scaled to [-1, 1] like the model's input; it must
keep an integer `label`).
The output JSON maps `<eval name>/pixel_1nn`, `<eval name>/pixel_ridge`,
`<eval name>/random_init/seed<s>/{1nn,ridge}`, `<fewshot name>/pixels/<metric>` and
`<fewshot name>/random_init/seed<s>/<metric>` to numbers.
"""
from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from absl import app, flags
from ml_collections import config_flags

import big_vision_relu  # noqa: F401  (quiets TensorFlow before it is imported)
import jax
import ml_collections
import numpy as np
from sklearn.linear_model import RidgeClassifier
from sklearn.neighbors import KNeighborsClassifier

from big_vision_relu import run as run_lib
from big_vision_relu.data import inputs
from big_vision_relu.evaluators import common, registry
from big_vision_relu.evaluators.fewshot_evaluator import FewShotEvaluator, embed_split

PIXEL_PP = 'decode(channels=1)|value_range(-1, 1)|keep("image", "label")'


class _Pixels:
  """Stands in for the model: its `pre_logits` are the raw pixels `[b, h * w * c]`."""

  def apply(self, variables: Any, images: jax.Array, train: bool) -> tuple[None, dict]:
    del variables, train
    return None, {"pre_logits": images.reshape(images.shape[0], -1)}


def _batch_pixels(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
  """`embed_split`'s view of `_Pixels`: a batch -> its raw pixels `[b, h * w * c]`."""
  _, out = _Pixels().apply(params, batch["image"], train=False)
  return out["pre_logits"]


def classifiers(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                y_test: np.ndarray) -> dict[str, float]:
  """Test accuracy (`1nn`, `ridge`) of 1-NN and of a ridge classifier on feature vectors
  `[n, d]`."""
  nearest = KNeighborsClassifier(n_neighbors=1, algorithm="brute").fit(x_train, y_train)
  ridge = RidgeClassifier(alpha=1.0).fit(x_train, y_train)
  return {"1nn": float(nearest.score(x_test, y_test)),
          "ridge": float(ridge.score(x_test, y_test))}


def compute(config: ml_collections.ConfigDict, seeds: Sequence[int],
            pixel_pp: str = PIXEL_PP) -> dict[str, float]:
  """Every baseline of the module docstring for `config` (a training config)."""
  run = run_lib.setup(config)
  mesh, axis, pipeline = run.mesh, run_lib.DATA_AXIS, run.config.input.pipeline
  evals = {name: registry.evaluator_config(cfg, f"evals.{name}")
           for name, cfg in run.config.evals.items()}
  batch_size = max(cfg.batch_size for cfg in evals.values())
  predict = common.make_predict_fn(run.model, "pre_logits")
  embed_network = jax.jit(lambda params, batch: predict(params, batch["image"]))

  def features(embed, params, data, pp) -> tuple[np.ndarray, np.ndarray]:
    return embed_split(embed, params, inputs.EvalData(
        data, pp, batch_size, pipeline=pipeline, mesh=mesh, data_axis=axis))

  results: dict[str, float] = {}
  with jax.set_mesh(mesh):
    init = jax.jit(run.init_state)
    random_params = {seed: init(jax.random.PRNGKey(seed))["params"] for seed in seeds}
    x_train, y_train = features(_batch_pixels, None, run.config.input.data, pixel_pp)
    network_train = {}  # seed -> the training split's features, embedded once
    for name, cfg in evals.items():
      if cfg.type == "classification":
        x_test, y_test = features(_batch_pixels, None, cfg.data, pixel_pp)
        for key, value in classifiers(x_train, y_train, x_test, y_test).items():
          results[f"{name}/pixel_{key}"] = value
        for seed, params in random_params.items():
          if seed not in network_train:
            network_train[seed] = features(embed_network, params, run.config.input.data,
                                           pixel_pp)
          test = features(embed_network, params, cfg.data, pixel_pp)
          for key, value in classifiers(*network_train[seed], *test).items():
            results[f"{name}/random_init/seed{seed}/{key}"] = value
      elif cfg.type == "fewshot":
        pixels = FewShotEvaluator(cfg, model=_Pixels(), mesh=mesh, data_axis=axis,
                                  pipeline=pipeline)
        results.update({f"{name}/pixels/{k}": v for k, v in pixels.run(None).items()})
        network = FewShotEvaluator(cfg, model=run.model, mesh=mesh, data_axis=axis,
                                   pipeline=pipeline)
        for seed, params in random_params.items():
          results.update({f"{name}/random_init/seed{seed}/{k}": v
                          for k, v in network.run(params).items()})
  return results


def main(argv: list[str]) -> None:
  del argv
  results = compute(FLAGS.config, [int(s) for s in FLAGS.seeds], FLAGS.pixel_pp)
  text = json.dumps(results, indent=1, sort_keys=True)
  if FLAGS.out:
    path = pathlib.Path(FLAGS.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
  print(text)


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  config_flags.DEFINE_config_file("config", None, "Training config (file.py:args).",
                                  lock_config=True)
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Initialisation seeds of the random network.")
  flags.DEFINE_string("pixel_pp", PIXEL_PP, "pp string giving the pixels (`image`, `label`).")
  flags.DEFINE_string("out", None, "Write the JSON here too.")
  app.run(main)
