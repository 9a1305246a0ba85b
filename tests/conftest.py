"""Test set-up: 8 simulated CPU devices (sharded == unsharded tests), quiet TensorFlow and one
compilation cache for the session."""
import atexit
import os
import shutil
import tempfile

# LLVM's optimisation of XLA:CPU's code is most of the suite's compile time (~9 s of a core in
# each trainer process the tests start) and none of what the tests check: every compilation of
# the suite, in this process and in the processes it starts (XLA_FLAGS replaced there too), is
# without it, so results compared with each other come from programs compiled alike.
FAST_COMPILE = "--xla_backend_optimization_level=0"
# XLA's default level, for a jit whose test is about what the deployed code computes bit for bit
# (two programs equal, or equal TensorFlow's rounding): optimisation changes the arithmetic.
PRODUCTION_COMPILE = {"xla_backend_optimization_level": 3}

# Must be set before jax is imported anywhere in the test process.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One persistent JAX compilation cache per session, made by the first process to load this file
# (pytest, or xdist's controller: its workers inherit the environment) and shared by the workers
# and every process a test starts (trainers, studies, benchmarks). The suite compiles the same
# programs many times: train() in one test after another, and ~50 small programs at every
# trainer's start (~9 s of a core; jax caches only those slower than 1 s by default, hence 0).
# A cached executable is the same program, so no result changes.
_CACHE_VARIABLE = "BIG_VISION_RELU_TEST_JAX_CACHE"
if _CACHE_VARIABLE not in os.environ:
  os.environ[_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="big_vision_relu_jax_cache_")
  atexit.register(shutil.rmtree, os.environ[_CACHE_VARIABLE], ignore_errors=True)
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_CACHE_VARIABLE]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

import importlib.util
import json
import pathlib
import resource
import socket
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Fixtures shared by test modules, as plugins: registered here, before the modules import them,
# so pytest rewrites their asserts.
pytest_plugins = ("tpu_scripts",)


def pytest_addoption(parser):
  parser.addoption(
      "--cpu_seconds", metavar="PATH",
      help="append one JSON line per test to PATH: its CPU seconds, those of its process and of "
           "every process it started and waited for (the suite's budget is CPU on 2 cores; "
           "--durations shows wall time, which tests sharing the cores inflate), and its "
           "xdist worker, start time and wall seconds (how the two workers were loaded)")


def _cpu_seconds() -> float:
  """CPU seconds of this process and of its children that were waited for."""
  usages = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
  return sum(u.ru_utime + u.ru_stime for u in usages)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  path = item.config.getoption("--cpu_seconds")
  if not path:
    yield
    return
  before, start = _cpu_seconds(), time.time()
  yield  # set-up (module fixtures too), call and teardown
  record = {"test": item.nodeid, "cpu_s": round(_cpu_seconds() - before, 2),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "master"),
            "start": round(start, 2), "wall_s": round(time.time() - start, 2)}
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")


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
