"""The trainer: sharded == unsharded, resume, preemption, errors.

In-process runs use tiny models; the command-line and SIGTERM tests start real
`python -m big_vision_relu.train` processes. Pods of two processes, kill -9 and a resume that ends
bit-identical: test_train_pods.py.
"""
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

from big_vision_relu import config as cfg_lib
from big_vision_relu import losses
from big_vision_relu import preemption
from big_vision_relu import run as run_lib
from big_vision_relu import train as train_lib
from big_vision_relu import workdir_config

from trainer_processes import (MAIN_CONFIG, TRAIN_METRICS, alive, assert_continues_from,
                               assert_trees_close, assert_trees_equal, final_params,
                               logged_records, spawn_trainer, tiny_config, workdir_files,
                               write_config)


# ------------------------------------------------------------------ sharded == unsharded

def test_data_parallel_and_fsdp_on_8_devices_equal_one_device(offline_data_dir, tmp_path):
  assert jax.device_count() == 8
  runs = {
      "one": (tiny_config(offline_data_dir), jax.devices()[:1]),
      "dp8": (tiny_config(offline_data_dir), None),
      "fsdp8": (tiny_config(offline_data_dir,
                            sharding_strategy=[(".*", 'fsdp(axis="data")')]), None),
  }
  params = {}
  for name, (config, devices) in runs.items():
    result = train_lib.train(config, str(tmp_path / name), devices=devices)
    assert result["step"] == 6
    step, params[name] = final_params(tmp_path / name)
    assert step == 6
  assert_trees_close(params["dp8"], params["one"], atol=1e-5)
  assert_trees_close(params["fsdp8"], params["one"], atol=1e-5)
  lines = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text()
           .splitlines()]
  assert [line["step"] for line in lines] == [1, 2, 3, 4, 5, 6]
  assert {"training_loss", "l2_grads", "l2_params", "l2_updates", "lr"} <= set(lines[0])
  assert {"img/sec/core", "core_hours"} <= set(lines[-1])
  assert lines[0]["l2_updates"] > 0  # the params moved: not two untouched inits compared
  assert (tmp_path / "one" / "config.json").exists()
  assert list((tmp_path / "one").glob("events.out.tfevents.*"))


def test_fsdp_really_shards_the_params(offline_data_dir, tmp_path):
  config = tiny_config(offline_data_dir, sharding_strategy=[(".*", 'fsdp(axis="data")')])
  model = run_lib.make_model(config)
  from big_vision_relu import sharding
  mesh = sharding.make_mesh([("data", -1)])
  abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))
  shardings = sharding.tree_shardings(abstract, config.sharding_strategy, mesh)
  kernel = shardings["params"]["Transformer"]["encoderblock_0"]["MlpBlock_0"]["Dense_0"]["kernel"]
  assert kernel.spec == jax.sharding.PartitionSpec(None, "data")  # (16, 32): 32 splits by 8
  bias = shardings["params"]["Transformer"]["encoderblock_0"]["LayerNorm_0"]["scale"]
  assert bias.spec == jax.sharding.PartitionSpec("data")  # (16,)


# ------------------------------------------------------------------ checkpoints and resume

def test_corrupt_newest_checkpoint_falls_back_with_a_warning(offline_data_dir, tmp_path, caplog):
  workdir = tmp_path / "run"
  train_lib.train(tiny_config(offline_data_dir), str(workdir))  # keeps steps 4 and 6
  _, expected = final_params(workdir)
  first = logged_records(workdir)
  assert [r["step"] for r in first] == [1, 2, 3, 4, 5, 6]
  newest = workdir / "checkpoints" / "6" / "state"
  victims = sorted(p for p in newest.rglob("*") if p.is_file() and p.stat().st_size > 0)
  assert victims
  for victim in victims:  # damage every data file of the newest step
    victim.write_bytes(b"garbage")
  result = train_lib.train(tiny_config(offline_data_dir), str(workdir))
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert any("Could not restore checkpoint step 6" in w for w in warnings), warnings
  # It restored step 4, and steps 5 and 6 were trained again from there exactly as the first
  # time (training from step 0 would log steps 1-4 again; from a fresh init, other values).
  assert result["start_step"] == 4 and result["step"] == 6
  resumed = assert_continues_from(logged_records(workdir), 4, first=6)
  assert [r["step"] for r in resumed] == [5, 6]
  for again, before in zip(resumed, first[4:]):
    assert {k: again[k] for k in TRAIN_METRICS} == {k: before[k] for k in TRAIN_METRICS}
  step, got = final_params(workdir)
  assert step == 6
  assert_trees_equal(got, expected)
  assert (workdir / "checkpoints" / "4").exists()  # the good checkpoint was never touched


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(offline_data_dir, tmp_path,
                                                                caplog):
  workdir = tmp_path / "run"
  train_lib.train(tiny_config(offline_data_dir, total_steps=2), str(workdir))
  _, good = final_params(workdir)
  # Same optimizer structure (the checkpoint must restore), absurd learning rate: a deliberate
  # change of the workdir's config.
  config = tiny_config(offline_data_dir, total_steps=6, lr=1e30)
  # On absl's logger too: a test before this one in the same worker may have set absl's
  # verbosity (flag parsing does), which would drop the INFO line checked below.
  caplog.set_level(logging.INFO, logger="absl")
  with pytest.raises(FloatingPointError, match=r"Non-finite loss or gradients at step \d+.*"
                     r"last good checkpoint is step 2"):
    train_lib.train(config, str(workdir), allow_config_change=True)
  assert any(r.getMessage().startswith("Resumed from step 2 ") for r in caplog.records)
  # Step 3 (the loss of the restored params, still finite) is the first step logged again.
  assert_continues_from(logged_records(workdir), 2, first=2)
  step, after = final_params(workdir)
  assert step == 2
  assert_trees_equal(after, good)


def test_a_workdir_refuses_another_config_unless_the_change_is_allowed(offline_data_dir,
                                                                      tmp_path):
  workdir = tmp_path / "run"
  train_lib.train(tiny_config(offline_data_dir, total_steps=4), str(workdir))
  before = workdir_files(workdir)
  assert {"config.json", "config_history.jsonl", "metrics.jsonl"} <= set(before)

  # Another config: stops before anything is written, naming every differing key.
  other = tiny_config(offline_data_dir, total_steps=4, lr=1e-2)
  other.model.attention = "softmax"
  with pytest.raises(workdir_config.ConfigChangedError, match=r"2 key\(s\) differ") as error:
    train_lib.train(other, str(workdir))
  assert '  lr: 0.003 -> 0.01\n' in str(error.value)
  assert '  model.attention: "relu" -> "softmax"\n' in str(error.value)
  assert "--allow_config_change" in str(error.value)
  assert workdir_files(workdir) == before
  # It stops before set-up: the config's dataset is not even looked for.
  elsewhere = tiny_config(offline_data_dir, total_steps=4)
  elsewhere.input.data = dict(name="imagenet2012", split="train",
                              data_dir=str(tmp_path / "no_data_here"))  # set-up would refuse
  with pytest.raises(workdir_config.ConfigChangedError, match=r"key\(s\) differ"):
    train_lib.train(elsewhere, str(workdir))
  assert workdir_files(workdir) == before

  # A deliberate change (more steps) continues the run from its last checkpoint.
  longer = tiny_config(offline_data_dir, total_steps=6)
  result = train_lib.train(longer, str(workdir), allow_config_change=True)
  assert result["start_step"] == 4 and result["step"] == 6
  resumed = assert_continues_from(logged_records(workdir), 4, first=4)
  assert [r["step"] for r in resumed] == [5, 6]
  assert json.loads((workdir / "config.json").read_text())["total_steps"] == 6
  history = [json.loads(line) for line in
             (workdir / "config_history.jsonl").read_text().splitlines()]
  assert [h["config"]["total_steps"] for h in history] == [4, 6]
  assert history[0]["changes"] == [] and history[1]["changes"] == ["total_steps: 4 -> 6"]
  assert all(h["time"] for h in history)

  # The same config again resumes (here: nothing left to train) and records nothing new.
  again = train_lib.train(tiny_config(offline_data_dir, total_steps=6), str(workdir))
  assert again["start_step"] == 6 and again["step"] == 6
  assert len((workdir / "config_history.jsonl").read_text().splitlines()) == 2


# ------------------------------------------------------------------ config errors

@pytest.mark.parametrize("change,match", [
    (dict(learning_rate=1e-3), r"Unknown key\(s\) in config: learning_rate"),
    (dict(total_epochs=3), "Set exactly one of total_steps, total_epochs, total_examples"),
    (dict(input=dict(data=dict(name="mnist5k", split="train"), batch_size=12,
                     pp="decode")), "batch_size=12 is not divisible by the 'data' mesh axis"),
    (dict(model=dict(variant="mu/4", attention="relu3")), "valid choices: softmax, relu"),
    (dict(model=dict(variant="mu/4", widht=3)),
     "Bad config.model.*widht.*Valid options: variant, .*, attention, seqlen_alpha"),
    (dict(loss="hinge"), "Unknown loss 'hinge'"),
    (dict(lr=-0.1), r"config.lr=-0.1 must be a finite number > 0 \(the peak learning rate"),
    (dict(lr=float("nan")), r"config.lr=nan must be a finite number > 0"),
    (dict(wd=-1e-4), r"config.wd=-0.0001 must be a finite number >= 0"),
    (dict(grad_clip_norm=-1.0), r"config.grad_clip_norm=-1.0 must be a finite number >= 0"),
    (dict(lr_mults=[("head/.*", -2.0)]), r"lr_mults: the multiplier of 'head/\.\*' is -2.0"),
    (dict(schedule=dict(warmup_steps=6)),
     r"warmup \(6 steps\) must be shorter than the run \(6 steps\); lower warmup_steps"),
    (dict(schedule=dict(warmup_steps=-1)), r"config.schedule.warmup_steps=-1 must be an int"),
    (dict(schedule=dict(warmup_percent=5)), r"warmup_percent=5 must be a fraction in \[0, 1\)"),
    (dict(schedule=dict(decay_type="exponential")),
     r"decay_type='exponential' is unknown; valid: \['cosine', 'linear', 'rsqrt'\]"),
    (dict(schedule=[("head/.*", dict(decay_type="rsqrt", timescale=0)), (".*", None)]),
     r"config.schedule rule 'head/\.\*'.timescale=0 must be a finite number > 0"),
    (dict(total_steps=0), r"config.total_steps=0 must be a positive number"),
    (dict(input=dict(data=dict(name="cifar100", split="train"), batch_size=16, pp="decode")),
     "Dataset 'cifar100' is not prepared"),
    (dict(xla_compiler_options=dict(xla_cpu_experimental_ynn_fusion_type=["reduce"])),
     "xla_compiler_options maps XLA option names to str, bool"),
    (dict(xla_compiler_options=dict(xla_cpu_no_such_option=True)),
     r"XLA \(cpu\) rejects config.xla_compiler_options=.*No such compile option"),
])
def test_bad_configs_fail_fast_with_a_clear_message(offline_data_dir, tmp_path, change, match):
  config = tiny_config(offline_data_dir)
  for key, value in change.items():
    if key == "input" and "data_dir" not in value["data"]:
      value["data"]["data_dir"] = offline_data_dir
    with config.ignore_type():  # e.g. a schedule dict replaced by a list of rules
      config[key] = value
  start = time.monotonic()
  with pytest.raises(ValueError if "not prepared" not in match else FileNotFoundError,
                     match=match):
    train_lib.train(config, str(tmp_path / "w"))
  assert time.monotonic() - start < 20
  assert not (tmp_path / "w" / "checkpoints").exists()


def test_xla_compiler_options_reach_the_training_step(offline_data_dir):
  """config.xla_compiler_options compiles the trainer's step: with YNNPACK's fusions off
  (docs/benchmarks.md) none is left in its executable; by default XLA:CPU uses some."""
  batch = dict(image=jax.ShapeDtypeStruct((16, 28, 28, 1), jnp.float32),
               labels=jax.ShapeDtypeStruct((16, 10), jnp.float32))

  def compiled_step(**overrides):
    run = run_lib.setup(tiny_config(offline_data_dir, **overrides))
    with jax.set_mesh(run.mesh):
      return run.update.lower(run.target, batch).compile().as_text()

  assert "__ynn_fusion" in compiled_step()
  assert "__ynn_fusion" not in compiled_step(
      xla_compiler_options=dict(xla_cpu_experimental_ynn_fusion_type=""))


def test_a_config_without_loss_trains_with_the_schemas_default(offline_data_dir):
  """The step reads the filled config: no `loss` in the config is the schema's default."""
  config = tiny_config(offline_data_dir)
  del config["loss"]
  run = run_lib.setup(config)
  assert run.config.loss == cfg_lib.TRAIN_SCHEMA["loss"].default
  images = jax.random.normal(jax.random.PRNGKey(1), (16, 28, 28, 1))
  labels = jax.nn.one_hot(jnp.arange(16) % 10, 10)
  with jax.set_mesh(run.mesh):
    state = jax.jit(run.init_state, out_shardings=run.state_shardings)(jax.random.PRNGKey(0))
    logits, _ = run.model.apply({"params": state["params"]}, images, train=False)
    expected = {name: float(jnp.mean(losses.per_example_loss(logits, labels, name)))
                for name in losses.LOSSES}
    batch = jax.device_put(dict(image=images, labels=labels), jax.sharding.NamedSharding(
        run.mesh, jax.sharding.PartitionSpec(run_lib.DATA_AXIS)))
    _, metrics = run.update(state, batch)  # no dropout: the train-mode logits are the same
  got = float(metrics["training_loss"])
  assert got == pytest.approx(expected[run.config.loss], rel=1e-5)
  others = [v for k, v in expected.items() if k != run.config.loss]
  assert all(got != pytest.approx(v, rel=1e-3) for v in others)


# ------------------------------------------------------------------ real processes


def _run(config_path, workdir, *, devices, extra=(), timeout=300, env=None):
  proc = spawn_trainer(config_path, workdir, devices=devices, extra=extra,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  out, _ = proc.communicate(timeout=timeout)
  assert proc.returncode == 0, out[-3000:]
  return out


def _printed_result(out: str) -> dict:
  """The JSON object the trainer prints last (its returned metrics; log lines may follow)."""
  return json.JSONDecoder().raw_decode(out, out.rindex("\n{") + 1)[0]


@pytest.mark.slow
def test_the_main_jobs_total_steps_can_be_set_on_the_command_line(offline_data_dir, tmp_path):
  """configs/local/mnist_relu.py trains by epochs (total_steps is an unset placeholder); the
  real trainer's --config flags switch it to steps."""
  workdir = tmp_path / "run"
  out = _run(MAIN_CONFIG, workdir, devices=1, env={"TFDS_DATA_DIR": offline_data_dir},
             extra=("--config.total_epochs=None", "--config.total_steps=1"))
  assert _printed_result(out)["step"] == 1
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["total_steps"] == 1 and "total_epochs" not in saved
  assert [r["step"] for r in logged_records(workdir)] == [1]
  assert final_params(workdir)[0] == 1


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(offline_data_dir, tmp_path):
  config = tiny_config(offline_data_dir, total_steps=400, ckpt_steps=1000,
                       log_training_steps=1)
  path = write_config(tmp_path, config)
  workdir = tmp_path / "run"
  proc = spawn_trainer(path, workdir, devices=1, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
  jsonl = workdir / "metrics.jsonl"
  deadline = time.monotonic() + 240
  while time.monotonic() < deadline and proc.poll() is None and (
      not jsonl.exists() or len(jsonl.read_text().splitlines()) < 3):
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == preemption.PREEMPTED_EXIT_CODE, out[-3000:]  # saved, not finished
  assert "Preemption notice (SIGTERM)" in out
  assert _printed_result(out)["preempted"] is True
  step, _ = final_params(workdir)
  assert 3 <= step < 400  # saved where it stopped, although no checkpoint was due


@pytest.mark.slow
def test_a_trainer_dies_with_the_test_process_that_started_it(offline_data_dir, tmp_path):
  """A suite killed from outside leaves no trainer behind: when the process that started a
  trainer is killed with SIGKILL (no Python clean-up runs), the trainer ends too (the kernel's
  SIGTERM: it saves and exits)."""
  path = write_config(tmp_path, tiny_config(offline_data_dir, total_steps=100_000,
                                            ckpt_steps=100_000, log_training_steps=1))
  workdir = tmp_path / "run"
  starter = subprocess.Popen(
      [sys.executable, "-c", "import sys, time\nfrom trainer_processes import spawn_trainer\n"
       "print(spawn_trainer(sys.argv[1], sys.argv[2], devices=1).pid, flush=True)\n"
       "time.sleep(600)", path, str(workdir)],
      cwd=pathlib.Path(__file__).parent, stdout=subprocess.PIPE, text=True)
  trainer = int(starter.stdout.readline())
  try:
    jsonl = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and alive(trainer) and (
        not jsonl.exists() or len(jsonl.read_text().splitlines()) < 2):
      time.sleep(0.05)
    assert alive(trainer), "the trainer ended before its starter was killed"
    starter.kill()
    starter.wait(timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and alive(trainer):
      time.sleep(0.05)
    assert not alive(trainer), "the trainer outlived the process that started it"
  finally:
    starter.kill()
    if alive(trainer):
      os.kill(trainer, signal.SIGKILL)
