"""What the tests of launch/tpu/*.sh share: the environment a script runs in, the `sh` fixture
that runs one, and fig1's runs. test_launch_tpu.py (dry runs, errors) and
test_launch_tpu_workers.py (the remote commands on fake workers) use it; tests/conftest.py
registers it as a plugin for its fixtures.
"""
import functools
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

TPU_DIR = ROOT / "launch" / "tpu"
BASH = shutil.which("bash")
ENV = {"TPU_NAME": "relu-test", "PROJECT": "proj", "ZONE": "europe-west4-a", "BUCKET": "bucket",
       "TPU_TYPE": "v3-32"}
ZP = ["--zone=europe-west4-a", "--project=proj"]
LOCAL_TOOLS = ("dirname", "basename", "mktemp", "rm", "tar", "gzip", "python3", "tail", "sleep")
FIG1 = "configs/paper/fig1.py"
DATA_DIR = "gs://bucket/tensorflow_datasets"
# data.sh's VM and the build command it runs there.
VM = "relu-vit-data"
PREPARE = "-m big_vision_relu.data.prepare --download"
BUILD_FLAGS = f"--data_dir={DATA_DIR} --download_dir=tfds_downloads"


@pytest.fixture(scope="module")
def local_bin(tmp_path_factory) -> pathlib.Path:
  """A PATH directory with only the tools the scripts use locally: no gcloud."""
  path = tmp_path_factory.mktemp("local_bin")
  for tool in LOCAL_TOOLS:
    found = shutil.which(tool)
    assert found, tool
    (path / tool).symlink_to(found)
  assert not (path / "gcloud").exists()
  return path


@pytest.fixture
def sh(local_bin, tmp_path):
  """sh(script, *args, env={...}, path_prefix=None) runs launch/tpu/<script> with bash.

  The environment is ENV plus `env` (a None value unsets a variable), nothing inherited.
  """
  home = tmp_path / "home"
  home.mkdir()

  def run(script, *args, env=None, path_prefix=None, timeout=30):
    full_env = {"PATH": str(local_bin), "HOME": str(home), "TMPDIR": str(tmp_path), **ENV}
    if path_prefix:
      full_env["PATH"] = f"{path_prefix}:{local_bin}"
    for key, value in (env or {}).items():
      if value is None:
        full_env.pop(key, None)
      else:
        full_env[key] = value
    return subprocess.run([BASH, str(TPU_DIR / script), *args], env=full_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)
  return run


@functools.cache
def fig1_runs() -> list[tuple[str, str]]:
  """(run id, --config value) of fig1, from the sweep module itself."""
  out = subprocess.run([sys.executable, "-m", "big_vision_relu.experiments.sweep", FIG1, "--list"],
                       cwd=ROOT, capture_output=True, text=True, check=True).stdout
  runs = [tuple(line.split("\t")) for line in out.splitlines()]
  assert len(runs) == 10
  return runs
