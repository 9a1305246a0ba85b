"""Every config validates and builds its model; sweeps expand to the paper's runs; step counts
follow the recipe arithmetic; every optional field takes a command-line override; config diffs."""
import functools
import json

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from big_vision_relu import config as cfg_lib
from big_vision_relu.experiments import sweep
from big_vision_relu import run as run_lib
from big_vision_relu import train as train_lib

from conftest import ROOT, load_config_module

CONFIG_ARGS = [
    ("configs/local/mnist_relu.py", None),
    ("configs/local/mnist_relu.py", "attention=softmax,qk_norm=False,patch=2"),
    ("configs/vit_i21k.py", None),
    ("configs/vit_i21k.py", "variant=S/8,attention=relu2,alpha=0.5,qk_norm=False,gated=True"),
    ("configs/vit_i21k.py", "L/16,attention=softmax,fsdp"),
    ("configs/vit_i1k.py", "variant=S/32,attention=sigmoid,alpha=2.0"),
    ("configs/vit_i21k.py", "runlocal"),
    ("configs/vit_i1k.py", "runlocal"),
    ("configs/repro/mnist_vit.py", None),
    ("configs/repro/mnist_vit.py", "size=B,patch=2,attention=gelu,alpha=0.5,qk_norm=False,"
                                   "gated=True,seed=2"),
]


@pytest.mark.parametrize("path,arg", CONFIG_ARGS)
def test_config_validates_and_builds_its_model(path, arg):
  config = load_config_module(path).get_config(arg)
  cfg_lib.validate_train_config(config)
  model = run_lib.make_model(config)
  size = 28 if "/local/" in path or "/repro/" in path or (arg and "runlocal" in arg) else 224
  channels = 1 if size == 28 else 3
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          jax.ShapeDtypeStruct((1, size, size, channels), jnp.float32))
  assert params["params"]["head"]["kernel"].shape[-1] == config.num_classes


def test_config_arguments_reach_the_model():
  config = load_config_module("configs/vit_i21k.py").get_config(
      "variant=S/8,attention=relu2,alpha=0.5,qk_norm=False,gated=True")
  assert dict(config.model) == dict(variant="S/8", pool_type="gap", posemb="learn",
                                    rep_size=False, attention="relu2", seqlen_alpha=0.5,
                                    qk_norm=False, gated=True)
  assert config.mixup.p == 0.2 and "randaug(2, 10)" in config.input.pp  # our S/8 choice
  with pytest.raises(ValueError, match="Unknown config argument 'atention'"):
    load_config_module("configs/vit_i21k.py").get_config("atention=relu")


def test_fmnist_res_resizes_every_pipeline_and_28_changes_nothing():
  module = load_config_module("configs/study/fmnist_vit.py")
  default, same = module.get_config("patch=4"), module.get_config("patch=4,res=28")
  assert default.to_json() == same.to_json()
  assert "resize" not in default.input.pp + default.evals.test.pp_fn
  config = module.get_config("patch=16,res=224,crop=50")
  pps = [config.input.pp, config.evals.test.pp_fn, config.evals.attention.pp_fn,
         config.evals.fewshot.pp_train, config.evals.fewshot.pp_eval]
  assert all(pp.startswith("decode(channels=1)|resize(224)|") for pp in pps), pps
  assert "inception_crop(224, area_min=50)|flip_lr" in config.input.pp
  with pytest.raises(ValueError, match="res=20: the images are 28 x 28"):
    module.get_config("res=20")
  with pytest.raises(ValueError, match=r"patch=5 must divide the 224-pixel side \(res\)"):
    module.get_config("patch=5,res=224")


@pytest.mark.parametrize("path,examples,expected_steps", [
    # 30 epochs of fall-2011 ImageNet-21k minus the 51,200 held-out images, batch 4096.
    ("configs/vit_i21k.py", 14_197_122 - 51_200, 103_608),
    # 300 epochs of imagenet2012 train[:99%] (TFDS rounds 99% of 1,281,167 to 1,268,355).
    ("configs/vit_i1k.py", 1_268_355, 92_898),
])
def test_step_counts_follow_the_recipe(path, examples, expected_steps):
  config = cfg_lib.validate_train_config(load_config_module(path).get_config(None))
  steps = run_lib.resolve_durations(config, examples / config.input.batch_size)
  assert steps["total"] == expected_steps
  assert config.schedule.warmup_steps == 10_000 and config.input.batch_size == 4096


@pytest.mark.parametrize("figure,count", [("fig1", 10), ("fig2", 342), ("fig3", 96),
                                          ("fig4", 96)])
def test_sweeps_expand_to_the_papers_runs(figure, count, monkeypatch):
  monkeypatch.chdir(ROOT)  # config arguments are relative to the repository, as in launch/
  runs = sweep.load_sweep(f"configs/paper/{figure}.py")
  assert len(runs) == count == len({r.run_id for r in runs})
  for run in runs:  # every run's config argument is a valid config with a valid model
    config = sweep.load_config(run)
    cfg_lib.validate_train_config(config)
    run_lib.make_model(config)


@pytest.mark.parametrize("figure,count", [("fig1", 18), ("fig2", 174), ("fig3", 64),
                                          ("fig4", 64)])
def test_reproduction_sweeps_expand_to_their_runs(figure, count, monkeypatch):
  """18 = 3 sizes x 2 attentions x 3 seeds; 174 = 2 lengths x (57 at seed 0 + 2 seeds x 15 at
  alpha 0 and 1 + softmax); 64 = 2 lengths x 2 activations x 8 alphas x on/off."""
  monkeypatch.chdir(ROOT)
  runs = sweep.load_sweep(f"configs/repro/{figure}.py")
  assert len(runs) == count == len({r.run_id for r in runs})
  for run in runs[:2] + runs[-2:]:
    config = sweep.load_config(run)
    cfg_lib.validate_train_config(config)
    assert config.model.patch_size == (run.args["patch"],) * 2
    assert config.seed == run.args["seed"] and config.model.gated == run.args["gated"]


def test_load_config_file_reads_config_arguments_as_the_trainer_flag_does(monkeypatch):
  monkeypatch.chdir(ROOT)
  default = sweep.load_config_file("configs/repro/mnist_vit.py")
  assert default == load_config_module("configs/repro/mnist_vit.py").get_config()
  changed = sweep.load_config_file("configs/repro/mnist_vit.py:patch=2,attention=gelu")
  assert changed.model.patch_size == (2, 2) and default.model.patch_size == (4, 4)
  assert changed.model.attention == "gelu" != default.model.attention


def test_run_ids_are_stable_and_shared_between_figures():
  fig1 = sweep.load_sweep(str(ROOT / "configs/paper/fig1.py"))
  assert fig1[1].run_id == "i21k-S32-relu-a1-qk_norm-nogated"
  assert fig1[1].config_arg == ("configs/vit_i21k.py:variant=S/32,attention=relu,alpha=1.0,"
                                "qk_norm=True,gated=False")
  fig2_ids = {r.run_id for r in sweep.load_sweep(str(ROOT / "configs/paper/fig2.py"))}
  fig3 = sweep.load_sweep(str(ROOT / "configs/paper/fig3.py"))
  shared = [r for r in fig3 if r.args["qk_norm"]]
  assert len(shared) == 48 and all(r.run_id in fig2_ids for r in shared)


def test_runlocal_config_trains(offline_data_dir, tmp_path):
  config = load_config_module("configs/vit_i1k.py").get_config("runlocal")
  config.input.data.data_dir = offline_data_dir
  config.total_steps = 6  # just past the 5 warmup steps
  for evaluator in config.evals.values():
    if "data" in evaluator:
      evaluator.data.data_dir = offline_data_dir
    else:
      evaluator.data_dir = offline_data_dir
  result = train_lib.train(config, str(tmp_path / "run"))
  assert result["step"] == 6 and result["test/num_examples"] == 256
  assert 0 <= result["fewshot/10shot_avg"] <= 1


@pytest.mark.parametrize("kw,size,channels,slack", [
    (dict(variant="Ti/16"), 224, 3, 1.03),
    (dict(variant="S/32", pool_type="tok", rep_size=True, gated=True), 224, 3, 1.03),
    # The reproduction's S model at L = 196 (sizes given directly, no variant). At width 64 the
    # non-matmul ops (norms, GELU, the L x L weights) are a larger share of XLA's count.
    (dict(width=64, depth=4, mlp_dim=256, num_heads=4, patch_size=(2, 2), gated=True), 28, 1,
     1.06),
])
def test_analytic_flops_match_xla_cost_analysis(kw, size, channels, slack):
  """The core-hour estimates count matmul FLOPs; XLA counts every op of the same forward."""
  from big_vision_relu.experiments import cost
  from big_vision_relu.models import vit
  model = vit.Model(1000, **kw)
  images = jax.ShapeDtypeStruct((1, size, size, channels), jnp.float32)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)
  xla_flops = jax.jit(lambda p, x: model.apply(p, x)[0]).lower(params, images).cost_analysis()
  analytic = cost.forward_flops_per_image(kw, image_size=size, channels=channels,
                                          num_classes=1000)
  assert analytic <= xla_flops["flops"] <= slack * analytic


# ------------------------------------------------------------------ command-line overrides

TRAIN_CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.py")
                       if "def get_config" in p.read_text())


def parse_config_flags(*argv: str) -> ml_collections.ConfigDict:
  """The config the trainer's --config flag (locked, as in train.py) gives for `argv`."""
  argv = ["train", *argv]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)
  values(argv)
  return values.config


def unset_fields(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, type]:
  """{dotted path: field type} of every None-valued field, at every level."""
  found = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      found.update(unset_fields(value, f"{prefix}{key}."))
    elif value is None:
      found[prefix + key] = config.get_type(key)
  return found


def every_config_arg() -> list[str]:
  """Each config file bare and with `runlocal` (where it has it), and every sweep's runs."""
  args = set(TRAIN_CONFIGS)
  args |= {f"{path}:runlocal" for path in TRAIN_CONFIGS
           if "runlocal" in (ROOT / path).read_text()}
  for path in sorted((ROOT / "configs").rglob("*.py")):
    if "def get_sweep" in path.read_text():
      args |= {run.config_arg for run in sweep.load_sweep(str(path))}
  return sorted(args)


def test_every_unset_field_of_every_config_is_a_placeholder(monkeypatch):
  """ml_collections cannot override a field holding a plain None; a placeholder it can."""
  monkeypatch.chdir(ROOT)
  config_args = every_config_arg()
  assert len(config_args) > 700  # the sweeps' runs are all there
  seen = {}
  for config_arg in config_args:
    unset = unset_fields(sweep.load_config_file(config_arg))
    assert "total_steps" in unset or "total_epochs" in unset, config_arg
    plain = sorted(path for path, kind in unset.items() if kind is type(None))
    assert not plain, f"{config_arg}: {plain} hold a plain None; use config.optional()"
    seen.setdefault((config_arg.partition(":")[0], tuple(sorted(unset))), config_arg)
  # One real command line per config file and set of unset fields: each takes a value.
  for (_, paths), config_arg in seen.items():
    config = parse_config_flags(f"--config={config_arg}", *(f"--config.{p}=7" for p in paths))
    assert [functools.reduce(lambda c, k: c[k], p.split("."), config) for p in paths] == (
        [7] * len(paths)), config_arg


def test_a_set_duration_can_be_swapped_on_the_command_line(monkeypatch):
  monkeypatch.chdir(ROOT)
  config = parse_config_flags("--config=configs/local/mnist_relu.py",
                              "--config.total_epochs=None", "--config.total_steps=20")
  assert (config.total_epochs, config.total_steps) == (None, 20)
  cfg_lib.validate_train_config(config)
  both = parse_config_flags("--config=configs/local/mnist_relu.py", "--config.total_steps=20")
  with pytest.raises(ValueError, match=r"exactly one of total_steps, total_epochs, "
                     r"total_examples \(got total_steps=20, total_epochs=30\).*"
                     r"--config.total_epochs=None --config.total_steps="):
    cfg_lib.validate_train_config(both)
  with pytest.raises(ValueError, match=r"config.total_steps='20x' must be a positive number"):
    cfg_lib.validate_train_config(parse_config_flags(
        "--config=configs/local/mnist_relu.py", "--config.total_epochs=None",
        "--config.total_steps=20x"))


def test_unset_fields_read_as_missing_keys():
  config = ml_collections.ConfigDict(dict(loss=cfg_lib.optional(), input=dict(prefetch=None),
                                          lr=0.1))
  config.lock()
  pruned = cfg_lib.without_unset(config)
  assert pruned.get("loss", "sigmoid_xent") == "sigmoid_xent"
  assert pruned.input.get("prefetch", 2) == 2 and pruned.lr == 0.1
  assert config.loss is None and "loss" in config  # the original is untouched


def test_keys_that_do_nothing_are_rejected():
  for key in ("pp_modules", "sharding_rules"):
    config = load_config_module("configs/local/mnist_relu.py").get_config("runlocal")
    config[key] = ["ops_general"] if key == "pp_modules" else [(".*", "data")]
    with pytest.raises(ValueError, match=rf"Unknown key\(s\) in config: {key}\. Valid keys:"):
      cfg_lib.validate_train_config(config)


def test_unset_keys_take_the_schemas_defaults():
  """What the trainer runs: every key filled in from TRAIN_SCHEMA, the given values kept; the
  config as given is untouched (it is what a workdir's config.json records)."""
  config = load_config_module("configs/local/mnist_relu.py").get_config("runlocal")
  with config.unlocked():
    del config["loss"], config["log_training_steps"], config["ckpt_steps"]
  given = json.loads(config.to_json_best_effort())
  filled = cfg_lib.validate_train_config(config)
  assert json.loads(config.to_json_best_effort()) == given
  assert filled.loss == cfg_lib.TRAIN_SCHEMA["loss"].default
  assert "prefetch" not in config.input
  assert filled.input.prefetch == cfg_lib.TRAIN_SCHEMA["input"]["prefetch"].default

  def unset(schema, config, prefix=""):
    """(dotted key, schema default) of every Key the config leaves unset."""
    for key, spec in schema.items():
      value = config.get(key) if config is not None else None
      if isinstance(spec, cfg_lib.Key):
        if value is None:
          yield prefix + key, spec.default
      else:
        yield from unset(spec, value, f"{prefix}{key}.")

  defaults = dict(unset(cfg_lib.TRAIN_SCHEMA, config), **cfg_lib.DURATION_DEFAULTS)
  assert {"loss", "mesh", "mixup.p", "input.prefetch", "log_training_steps"} <= set(defaults)
  for key, default in defaults.items():
    value = functools.reduce(lambda c, k: c[k], key.split("."), filled)
    if isinstance(value, ml_collections.ConfigDict):
      value = value.to_dict()
    assert json.dumps(value) == json.dumps(default), key  # tuples read back as lists
  changes = cfg_lib.config_changes(given, json.loads(filled.to_json_best_effort()))
  assert changes and all(old is None for _, old, _ in changes)  # only unset keys were filled


# ------------------------------------------------------------------ config diffs

def as_json(config: ml_collections.ConfigDict) -> dict:
  return json.loads(config.to_json_best_effort())


def test_config_changes_name_every_differing_key_with_both_values():
  old = ml_collections.ConfigDict(dict(
      lr=1e-3, total_steps=cfg_lib.optional(), total_epochs=cfg_lib.optional(30),
      model=dict(attention="relu", patch_size=(7, 7)), mesh=[("data", -1)]))
  new = ml_collections.ConfigDict(dict(
      lr=1e-3, total_steps=cfg_lib.optional(100), total_epochs=cfg_lib.optional(),
      model=dict(attention="softmax", patch_size=[7, 7], qk_norm=True), mesh=[["data", -1]],
      evals=dict(test=dict(type="classification"))))
  changes = cfg_lib.config_changes(as_json(old), as_json(new))
  # Tuples and lists are the same in JSON; so are an unset placeholder and a missing key.
  assert changes == [("evals", None, {"test": {"type": "classification"}}),
                     ("model.attention", "relu", "softmax"), ("model.qk_norm", None, True),
                     ("total_epochs", 30, None), ("total_steps", None, 100)]
  assert cfg_lib.format_changes(changes).splitlines() == [
      '  evals: unset -> {"test": {"type": "classification"}}',
      '  model.attention: "relu" -> "softmax"', "  model.qk_norm: unset -> true",
      "  total_epochs: 30 -> unset", "  total_steps: unset -> 100"]
  assert cfg_lib.config_changes(as_json(old), as_json(old)) == []
  assert cfg_lib.config_changes({"a": None, "b": {"c": None}}, {"b": {}}) == []


@pytest.mark.parametrize("path", ["configs/vit_i21k.py", "configs/vit_i1k.py"])
def test_paper_fewshot_preprocessing_is_big_visions(path):
  """resize(256)|central_crop(224), as big_vision's few-shot configs; not a squash to 224."""
  fewshot = load_config_module(path).get_config("").evals.fewshot
  for pp in (fewshot.pp_train, fewshot.pp_eval):
    assert "|resize(256)|central_crop(224)|" in pp, pp
  # On a real (non-square) JPEG: squashed to 256 x 256, then the central 224 x 224.
  import numpy as np
  import tensorflow as tf

  from big_vision_relu.data import pp as pp_lib
  pixels = np.random.default_rng(0).integers(0, 256, (300, 400, 3), np.uint8)
  jpeg = tf.io.encode_jpeg(pixels)
  out = pp_lib.get_preprocess_fn(fewshot.pp_eval)({"image": jpeg, "label": tf.constant(3)})
  assert out["image"].shape == (224, 224, 3) and int(out["label"]) == 3
  assert -1 <= float(tf.reduce_min(out["image"])) <= float(tf.reduce_max(out["image"])) <= 1
  # The offline configs keep squashing their small images to the model's size.
  local = load_config_module("configs/local/mnist_relu.py").get_config("").evals.fewshot
  assert "|resize(28)|" in local.pp_train and "central_crop" not in local.pp_train
