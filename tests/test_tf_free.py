"""Training and evaluation where TensorFlow is not installed (issue 85): a venv holding only jax,
jaxlib, flax, optax, orbax-checkpoint, ml_collections, absl-py and numpy (with what they need;
no tensorflow, tensorflow_datasets, clu, scikit-learn or mlxtend) and the project installed with
--no-deps. There the Fashion-MNIST study model trains from Debian's IDX files through the
in-memory pipeline, is killed after a checkpoint and resumed to the final metrics of an
uninterrupted run, evaluators included, and `evaluate` reproduces them from the checkpoint.

The venv gets the versions of this one, pinned, so pip resolves nothing and installs the wheels
already fetched for the suite's venv (launch/test.sh), without compiling them to bytecode (the
first process compiles what it imports). Measured on 2 busy cores: ~95 s of CPU in all, ~40 of
them the first training process.
"""
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from packaging.requirements import Requirement

from conftest import FAST_COMPILE, ROOT
from test_fashion_mnist import _debian_files_present

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "ml-collections", "absl-py",
            "numpy")
ABSENT = ("tensorflow", "tensorflow_datasets", "clu", "sklearn", "mlxtend")
CONFIG = "configs/study/fmnist_vit.py:input=memory,runlocal,patch=4"
# Evaluations at the first and the last step only (a cadence of the whole run).
FLAGS = ("--config.total_steps=12", "--config.ckpt_steps=2", "--config.log_training_steps=3",
         *(f"--config.evals.{name}.log_percent=1.0" for name in ("test", "fewshot", "attention")))


def _closure(packages) -> list[str]:
  """`name==version` of `packages` and everything they require here (extras followed)."""
  pins, todo = {}, [(name, frozenset()) for name in packages]
  seen = set()
  while todo:
    name, extras = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if (key, extras) in seen:
      continue
    seen.add((key, extras))
    distribution = importlib.metadata.distribution(key)
    pins[key] = distribution.version
    for text in distribution.requires or ():
      requirement = Requirement(text)
      if requirement.marker is None or any(
          requirement.marker.evaluate({"extra": extra}) for extra in extras or {""}):
        todo.append((requirement.name, frozenset(requirement.extras)))
  return [f"{name}=={version}" for name, version in sorted(pins.items())]


def _pip(python, *args):
  subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
                  "--no-deps", "--no-compile", *args], check=True, timeout=600)


@pytest.fixture(scope="module")
def tf_free_python(tmp_path_factory) -> str:
  root = tmp_path_factory.mktemp("tf_free")
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
  python = str(root / "venv" / "bin" / "python")
  _pip(python, *_closure(PACKAGES))
  source = root / "project"  # a copy: pip's build leaves build/ and *.egg-info in the tree
  shutil.copytree(ROOT / "big_vision_relu", source / "big_vision_relu",
                  ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(ROOT / name, source / name)
  _pip(python, str(source))
  return python


def _env(tmp_path):
  """One device; bytecode written and a compilation cache of every program (also the small
  ones, which jax does not cache by default), so that only the first of the four processes
  compiles Python and XLA."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
  return {**env, "XLA_FLAGS": f"--xla_force_host_platform_device_count=1 {FAST_COMPILE}",
          "JAX_PLATFORMS": "cpu",
          "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache"),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def _train(python, workdir, **popen):
  return subprocess.Popen([python, "-m", "big_vision_relu.train", "--config",
                           str(ROOT / CONFIG), "--workdir", str(workdir), *FLAGS],
                          env=_env(workdir.parent), cwd=workdir.parent, **popen)


def _finish(proc) -> tuple[dict, str]:
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, out[-4000:]
  return json.JSONDecoder().raw_decode(out, out.rindex("\n{") + 1)[0], out


@pytest.mark.slow
@pytest.mark.skipif(not _debian_files_present() and not os.environ.get("CI"),
                    reason="needs `apt-get install dataset-fashion-mnist` (CI installs it)")
def test_the_study_model_trains_resumes_and_evaluates_without_tensorflow(tf_free_python,
                                                                         tmp_path):
  python, text = tf_free_python, dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  for name in ABSENT:  # the premise: none of them can be imported there
    probe = subprocess.run([python, "-c", f"import {name}"], capture_output=True, text=True,
                           env=_env(tmp_path), cwd=tmp_path)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, name

  expected, out = _finish(_train(python, tmp_path / "uninterrupted", **text))
  assert "clu is not installed: no TensorBoard events" in out
  assert expected["step"] == 12 and expected["test/num_examples"] == 32
  assert "fewshot/digits_10shot" in expected and "attention/layer3/zeros" in expected

  workdir = tmp_path / "killed"
  proc = _train(python, workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 300
  while not (workdir / "checkpoints" / "2").exists() and time.monotonic() < deadline:
    assert proc.poll() is None, "the run ended before its first checkpoint"
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert saved and 12 not in saved, saved

  resumed, out = _finish(_train(python, workdir, **text))
  assert f"Resumed from step {max(saved)} " in out and resumed["start_step"] == max(saved)
  timing = {"img/sec/core", "core_hours"}  # measured, not computed
  assert {k: v for k, v in resumed.items() if k not in timing | {"start_step"}} == {
      k: v for k, v in expected.items() if k not in timing | {"start_step"}}

  result = subprocess.run([python, "-m", "big_vision_relu.evaluate", "--workdir", str(workdir),
                           "--nomultihost"], env=_env(tmp_path), cwd=tmp_path, timeout=600, **text)
  assert result.returncode == 0, result.stdout[-4000:]
  evaluated = json.loads(result.stdout[result.stdout.index("\n{") + 1:])
  assert evaluated == {"step": 12, **{k: v for k, v in expected.items() if "/" in k
                                      and k.split("/")[0] in ("test", "fewshot", "attention")}}
