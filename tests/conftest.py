"""Test set-up: 8 simulated CPU devices (sharded == unsharded tests) and quiet TensorFlow."""
import os

# Must be set before jax is imported anywhere in the test process.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import importlib.util
import pathlib
import socket

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Fixtures shared by test modules, as plugins: registered here, before the modules import them,
# so pytest rewrites their asserts.
pytest_plugins = ("tpu_scripts",)


def load_config_module(relative_path: str):
  """Imports a config file (configs/...py) as a module, as --config does."""
  path = ROOT / relative_path
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def block_network(mp: pytest.MonkeyPatch) -> list:
  """Makes every socket connection / DNS lookup raise; returns the list of attempts."""
  attempts = []

  def refuse(*args, **kwargs):
    attempts.append(args)
    raise OSError("network disabled by the test")
  for name in ("create_connection", "getaddrinfo"):
    mp.setattr(socket, name, refuse)
  mp.setattr(socket.socket, "connect", refuse)
  return attempts


@pytest.fixture(scope="session")
def offline_data_dir(tmp_path_factory) -> str:
  """A TFDS data dir with the offline datasets (mnist5k, digits) built once per session."""
  import tensorflow_datasets as tfds

  from big_vision_relu.data import builders, datasets
  tfds.disable_progress_bar()
  path = str(tmp_path_factory.mktemp("tfds"))
  for name in builders.OFFLINE_DATASETS:
    datasets.get_builder(name, path)
  return path


@pytest.fixture(scope="session", autouse=True)
def _shared_compilation_cache(tmp_path_factory):
  """Gives the processes the tests start (trainers, studies, benchmarks) one persistent JAX
  compilation cache, shared by the xdist workers: the suite's many short runs compile the same
  few programs. Only subprocesses see it: this process's jax read its configuration when it was
  imported, at collection. A cached executable is the same program, so no result changes."""
  base = tmp_path_factory.getbasetemp()  # under xdist, a worker's own, in the session's dir
  shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("JAX_COMPILATION_CACHE_DIR", str(shared / "jax_cache"))
    yield
