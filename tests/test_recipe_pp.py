"""The paper's recipes' pp strings on real JPEGs: every variant of configs/vit_i21k.py and
configs/vit_i1k.py (train, eval and few-shot pp) through the real pp registry and tf.data, the
trainer's mixup on their output, and imagenet21k's builder output through training_batches."""
import functools
import io

import jax
import numpy as np
import PIL.Image
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from big_vision_relu.data import imagenet21k, input_pipeline, label_maps
from big_vision_relu.data import pp as pp_lib
from big_vision_relu.data.mixup import mixup
from big_vision_relu.experiments import recipes

import imagenet21k_fixture as fixture
from conftest import block_network, load_config_module

VARIANTS = tuple(recipes.I21K_AUGMENTATION)  # S/32 S/16 B/32 B/16 L/16 S/8
RECIPES = ("configs/vit_i21k.py", "configs/vit_i1k.py")
SIZES = ((375, 500), (500, 333), (180, 240), (224, 224), (96, 130))  # (height, width)
LABELS = (0, 7, 999, 3, 512)  # distinct, so every mixed pair of labels is visible
SEEDS = np.arange(2 * len(SIZES), dtype=np.int64).reshape(len(SIZES), 2) + 11


@functools.cache
def _jpegs() -> tuple[bytes, ...]:
  rng = np.random.default_rng(0)
  return tuple(fixture.photo_jpeg(rng, h, w) for h, w in SIZES)


@functools.cache
def _config(path: str, variant: str):
  return load_config_module(path).get_config(f"variant={variant}")


@functools.cache
def _run(pp: str, seeded: bool = True) -> dict[str, np.ndarray]:
  """`pp` on every JPEG through tf.data, batched; `seeded` adds the train pipeline's `_rng`."""
  examples = {"image": list(_jpegs()), "label": np.array(LABELS, np.int64)}
  if seeded:
    examples[pp_lib.RNG_KEY] = SEEDS
  ds = tf.data.Dataset.from_tensor_slices(examples).map(pp_lib.get_preprocess_fn(pp))
  out = next(ds.batch(len(SIZES)).as_numpy_iterator())
  out.pop(pp_lib.RNG_KEY, None)  # as training_batches does
  return out


def _randaug_magnitude(pp: str) -> float | None:
  ops = {name: args for name, args, _ in pp_lib.parse(pp)}
  return ops["randaug"][1] if "randaug" in ops else None


def _check_image(image: np.ndarray) -> None:
  assert image.shape == (len(SIZES), 224, 224, 3) and image.dtype == np.float32
  assert image.min() >= -1 and image.max() <= 1
  assert all(x.std() > 0.05 for x in image)  # not blank


def _check_onehot(labels: np.ndarray, num_classes: int) -> None:
  assert labels.shape == (len(SIZES), num_classes) and labels.dtype == np.float32
  np.testing.assert_array_equal(labels, np.eye(num_classes, dtype=np.float32)[list(LABELS)])


def _expected_magnitude(path: str, variant: str) -> float | None:
  return recipes.I21K_AUGMENTATION[variant][0] if "i21k" in path else 15


@pytest.mark.parametrize("path", RECIPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_train_pp_on_jpegs(path, variant):
  config = _config(path, variant)
  assert _randaug_magnitude(config.input.pp) == _expected_magnitude(path, variant)
  out = _run(config.input.pp)
  assert set(out) == {"image", "labels"}
  _check_image(out["image"])
  _check_onehot(out["labels"], config.num_classes)


def test_randaug_magnitude_changes_the_output():
  by_magnitude = {}
  for variant in VARIANTS:  # the i1k recipe's magnitude (15) is L/16's in i21k
    pp = _config("configs/vit_i21k.py", variant).input.pp
    by_magnitude.setdefault(_randaug_magnitude(pp), _run(pp)["image"])
  assert set(by_magnitude) == {None, 0, 10, 15}
  # Same seeds: the crop and flip are the same (each op splits its own seed off `_rng`) and
  # randaug picks the same ops, so any difference comes from the magnitude. Magnitude 0 is not
  # a no-op (solarize inverts, posterize keeps 1 bit, blends use factor 0.1: see randaug.py).
  for a in by_magnitude:
    for b in by_magnitude:
      if a != b:
        assert np.abs(by_magnitude[a] - by_magnitude[b]).max() > 0.1, (a, b)
  pp = _config("configs/vit_i21k.py", "B/16").input.pp  # deterministic given the seeds
  np.testing.assert_array_equal(_run(pp)["image"], _run.__wrapped__(pp)["image"])


def _resize_reference(jpeg: bytes, hw: tuple[int, int], crop: int) -> np.ndarray:
  """PIL: decode, resize to `hw` (box filter ~ area / bilinear), central crop, to [-1, 1]."""
  with PIL.Image.open(io.BytesIO(jpeg)) as image:
    resized = np.asarray(image.convert("RGB").resize(hw[::-1], PIL.Image.BILINEAR),
                         np.float32)
  top, left = (hw[0] - crop) // 2, (hw[1] - crop) // 2
  return resized[top:top + crop, left:left + crop] / 127.5 - 1


@pytest.mark.parametrize("path", RECIPES)
def test_eval_and_fewshot_pp_on_jpegs(path):
  pp_strings = set()
  for variant in VARIANTS:
    config = _config(path, variant)
    for name, evaluator in config.evals.items():
      if evaluator.type == "classification":
        pp_strings.add(("eval", evaluator.pp_fn, 1000 if name == "i1k" else config.num_classes))
      else:
        pp_strings.update({("fewshot", evaluator.pp_train, None),
                           ("fewshot", evaluator.pp_eval, None)})
  assert len(pp_strings) == (3 if "i21k" in path else 2)  # the same for every variant
  for kind, pp, num_classes in sorted(pp_strings):
    out = _run(pp, seeded=False)  # eval pipelines give no `_rng`: nothing random may run
    _check_image(out["image"])
    if kind == "eval":
      _check_onehot(out["labels"], num_classes)
      sizes = [(round(h * 256 / min(h, w)), round(w * 256 / min(h, w))) for h, w in SIZES]
    else:
      np.testing.assert_array_equal(out["label"], LABELS)
      sizes = [(256, 256)] * len(SIZES)
    for jpeg, hw, image in zip(_jpegs(), sizes, out["image"]):
      assert np.abs(image - _resize_reference(jpeg, hw, 224)).mean() < 0.03, (pp, hw)


@pytest.mark.parametrize("path", RECIPES)
def test_trainer_mixup_on_recipe_batches(path):
  for variant in VARIANTS:
    config = _config(path, variant)
    expected_p = (recipes.I21K_AUGMENTATION[variant][1] if "i21k" in path
                  else 0.2 if variant == "S/32" else 0.5)
    p = config.mixup.p if "mixup" in config else None
    assert p == expected_p, variant
    if not p:
      continue
    batch = _run(config.input.pp)
    # As run.make_update_fn calls it.
    images, labels = mixup(jax.random.key(3), (batch["image"], batch["labels"]), p=p,
                           fold_in=config.mixup.fold_in)
    images, labels = np.asarray(images), np.asarray(labels)
    np.testing.assert_allclose(labels.sum(-1), 1, rtol=1e-6)
    assert labels.min() >= 0
    lam = labels[0, LABELS[0]]  # one ratio per batch: example i mixed with i - 1
    assert 0 < lam < 1
    expected = lam * batch["labels"] + (1 - lam) * np.roll(batch["labels"], 1, axis=0)
    np.testing.assert_allclose(labels, expected, atol=1e-6)
    np.testing.assert_allclose(
        images, lam * batch["image"] + (1 - lam) * np.roll(batch["image"], 1, axis=0),
        atol=1e-5)


@pytest.mark.parametrize("release", ["fall2011", "winter2021"])
def test_imagenet21k_build_through_training_batches(tmp_path, release):
  """A fixture build of the release, read by the recipe's input spec and train pp."""
  tfds.disable_progress_bar()
  wnids = ("n01440764", "n01443537", "n00004475", "n04399382")[:3 if release == "fall2011"
                                                                 else 4]
  rng = np.random.default_rng(1)
  files = {f"{w}/{w}_{i}.JPEG": fixture.photo_jpeg(rng, *SIZES[(i + k) % len(SIZES)])
           for k, w in enumerate(wnids) for i in range(3)}
  manual = fixture.write_synset_tars(tmp_path / "manual", files)
  config = load_config_module("configs/vit_i21k.py").get_config(f"variant=B/16,release={release}")
  data = dict(config.input.data, split="full", data_dir=str(tmp_path / "data"))
  with pytest.MonkeyPatch.context() as mp:
    block_network(mp)
    if release == "winter2021":
      # The registered config, as the recipe names it, sized for the fixture.
      mp.setattr(imagenet21k.WINTER2021, "num_classes", len(wnids))
      fixture.build(manual, data["data_dir"], imagenet21k.WINTER2021)
    else:  # Google's order, a custom subset (fall2011 itself needs all 21,841 tars)
      order = label_maps.imagenet21k_wnids()
      fixture.build(manual, data["data_dir"], imagenet21k.Imagenet21kConfig(
          name="fall2011_subset", wnids=tuple(sorted(wnids, key=order.index))))
      data["name"] = "imagenet21k/fall2011_subset"
  batches = input_pipeline.training_batches(data, config.input.pp, 4, seed=0,
                                            process_index=0, process_count=1)
  try:
    seen = [next(batches) for _ in range(3)]  # 12 examples: at least one epoch
  finally:
    batches.close()
  for batch in seen:
    assert set(batch) == {"image", "labels"}
    assert batch["image"].shape == (4, 224, 224, 3) and batch["image"].dtype == np.float32
    assert -1 <= batch["image"].min() and batch["image"].max() <= 1
    assert batch["labels"].shape == (4, config.num_classes)
    np.testing.assert_array_equal(batch["labels"].sum(-1), 1)
  labels = {int(i) for b in seen for i in b["labels"].argmax(-1)}
  assert labels == set(range(len(wnids)))
  mixed = mixup(jax.random.key(0), (seen[0]["image"], seen[0]["labels"]), p=config.mixup.p)
  np.testing.assert_allclose(np.asarray(mixed[1]).sum(-1), 1, rtol=1e-6)

