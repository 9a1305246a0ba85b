"""What the trainer's tests share (test_train.py, test_train_pods.py): the main job's config
shrunk to seconds, real `python -m big_vision_relu.train` processes, and reading a workdir's
newest checkpoint."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from big_vision_relu.experiments import study

from conftest import FAST_COMPILE, ROOT, load_config_module

MAIN_CONFIG = "configs/local/mnist_relu.py"


def tiny_config(data_dir: str, **overrides) -> ml_collections.ConfigDict:
  """The main job's config shrunk to seconds: 1 block of width 16 on 16 tokens."""
  config = load_config_module(MAIN_CONFIG).get_config("runlocal")
  config.input.data.data_dir = data_dir
  config.input.batch_size = 16
  config.model = dict(patch_size=(7, 7), width=16, depth=1, mlp_dim=32, num_heads=2,
                      attention="relu", qk_norm=True)
  config.total_steps = 6
  config.ckpt_steps = 2
  config.log_training_steps = 1
  config.evals = ml_collections.ConfigDict()
  for key, value in overrides.items():
    config[key] = value
  return config


def final_params(workdir) -> tuple[int, dict]:
  """(step, params) of the newest checkpoint, read with orbax directly (no target tree)."""
  directory = pathlib.Path(workdir) / "checkpoints"
  step = max(int(p.name) for p in directory.iterdir() if p.name.isdigit())
  # On this process's first device, whatever topology wrote it.
  with ocp.StandardCheckpointer() as checkpointer:
    path = (directory / str(step) / "state").absolute()
    metadata = checkpointer.metadata(path).item_metadata
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          metadata)
    state = checkpointer.restore(path, target)
  return step, jax.tree.map(np.asarray, state["params"])

def logged_records(workdir) -> list[dict]:
  """metrics.jsonl: one dict per logged step, in the order written (a resumed run appends)."""
  return [json.loads(line) for line in
          (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def assert_continues_from(records: list[dict], start_step: int, first: int) -> list[dict]:
  """The records from index `first` on are a run resumed at `start_step`: they begin at
  start_step + 1 and none of the steps up to start_step was logged twice. Returns them."""
  resumed = records[first:]
  assert resumed and resumed[0]["step"] == start_step + 1, [r["step"] for r in records]
  steps = [r["step"] for r in records if r["step"] <= start_step]
  assert len(steps) == len(set(steps)), steps
  return resumed


TRAIN_METRICS = ("training_loss", "l2_grads", "l2_params", "l2_updates", "lr")


def workdir_files(directory) -> dict[str, bytes]:
  """Every file under `directory` (relative path -> bytes): "nothing was written" compares two."""
  return {str(p.relative_to(directory)): p.read_bytes()
          for p in sorted(pathlib.Path(directory).rglob("*")) if p.is_file()}


def assert_trees_close(a, b, atol):
  """The same tree paths, the values within `atol`."""
  flat_a, flat_b = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b):
    np.testing.assert_allclose(x, y, atol=atol, rtol=0, err_msg=jax.tree_util.keystr(path))


def assert_trees_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def free_port() -> int:
  """A TCP port free on loopback now (for a coordinator)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def write_config(tmp_path, config, name="config.py") -> str:
  """A config file holding `config` (as JSON), so subprocesses can take --config."""
  path = tmp_path / name
  path.write_text(
      "import json\nimport ml_collections\n\n\ndef get_config():\n"
      f"  return ml_collections.ConfigDict(json.loads({config.to_json()!r}))\n")
  return str(path)


def spawn_trainer(config_path, workdir, *, devices, extra=(), env=None, **popen):
  """A trainer process on `devices` simulated CPU devices; `popen`: subprocess.Popen's options.

  Started through the study's launcher (experiments/pinned.py, no core pinned), so the kernel
  sends it SIGTERM if this test process dies first: a suite killed from outside would otherwise
  leave its trainers running, and some are 100,000-step runs."""
  env = {**os.environ,
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}",
         "JAX_PLATFORMS": "cpu", **(env or {})}
  return subprocess.Popen(
      [*study.PINNED_LAUNCHER, "--", sys.executable, "-m", "big_vision_relu.train",
       "--config", config_path, "--workdir", str(workdir), *extra], env=env, cwd=ROOT, **popen)


def alive(pid: int) -> bool:
  """True while `pid` runs (a zombie nobody has reaped yet counts as dead)."""
  try:
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
  except FileNotFoundError:
    return False
  return "\nState:\tZ" not in status


def spawn_pair(config_path, workdir, *, logs=None, extra=()) -> list[subprocess.Popen]:
  """Two trainer processes (2 CPU devices each) joined on loopback into one 2-process run.

  Each writes stdout and stderr to its file in `logs` if given (nobody need read a pipe while
  they run), else to a text pipe; `extra`: more trainer flags."""
  port = free_port()
  procs = []
  for i in range(2):
    output = {"stdout": logs[i].open("w")} if logs else {"stdout": subprocess.PIPE, "text": True}
    procs.append(spawn_trainer(
        config_path, workdir, devices=2, stderr=subprocess.STDOUT, **output,
        extra=("--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
               "--process_id", str(i), *extra)))
  return procs
