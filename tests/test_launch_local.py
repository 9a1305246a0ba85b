"""launch/local.sh: its arguments are read by what they are, and its default workdir names the
config's arguments and overrides. Its --dry-run prints the commands it would run."""
import pathlib
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = ROOT / "launch" / "local.sh"
MAIN = "configs/local/mnist_relu.py"


def local_sh(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], capture_output=True,
                        text=True, check=False, timeout=30)


def train_command(*args: str) -> list[str]:
  """The trainer's arguments that `local.sh --dry-run ARGS` prints (after `-m ...train`)."""
  result = local_sh(*args)
  assert result.returncode == 0, result.stderr
  lines = [shlex.split(line) for line in result.stdout.splitlines()
           if "big_vision_relu.train" in line]
  assert len(lines) == 1, result.stdout
  return lines[0][lines[0].index("big_vision_relu.train") + 1:]


def test_shellcheck_clean():
  # Every script beside local.sh too (study.sh, test.sh, ...); launch/tpu has its own test.
  shellcheck = pathlib.Path(sys.executable).parent / "shellcheck"
  scripts = sorted(str(p) for p in SCRIPT.parent.glob("*.sh"))
  assert str(SCRIPT) in scripts
  result = subprocess.run([str(shellcheck), "-x", *scripts], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("args,expected", [
    ((), ["--config", MAIN, "--workdir", "workdirs/mnist_relu"]),  # the README's main job
    ((f"{MAIN}:attention=softmax",),
     ["--config", f"{MAIN}:attention=softmax",
      "--workdir", "workdirs/mnist_relu-attention=softmax"]),
    ((MAIN, "--config.lr=1e-3"),
     ["--config", MAIN, "--workdir", "workdirs/mnist_relu-lr=1e-3", "--config.lr=1e-3"]),
    # Flags anywhere; --allow_config_change does not change the config, nor the name.
    (("--config.lr=1e-3", "configs/vit_i21k.py:variant=S/16,runlocal", "--allow_config_change"),
     ["--config", "configs/vit_i21k.py:variant=S/16,runlocal",
      "--workdir", "workdirs/vit_i21k-variant=S_16,runlocal-lr=1e-3", "--config.lr=1e-3",
      "--allow_config_change"]),
    ((MAIN, "workdirs/mine", "--config.total_epochs=60", "--allow_config_change"),
     ["--config", MAIN, "--workdir", "workdirs/mine", "--config.total_epochs=60",
      "--allow_config_change"]),
])
def test_arguments_are_read_by_what_they_are(args, expected):
  assert train_command(*args) == expected


def test_different_configs_get_different_default_workdirs():
  variants = [(), (f"{MAIN}:attention=softmax",), (f"{MAIN}:softmax",),
              (MAIN, "--config.lr=1e-2"),
              (MAIN, "--config.model.attention=softmax", "--config.lr=1e-2"),
              ("configs/repro/mnist_vit.py",)]
  workdirs = [train_command(*args)[3] for args in variants]
  assert len(set(workdirs)) == len(workdirs), workdirs
  long = train_command(MAIN, *(f"--config.evals.test.pp_fn={'x' * 60}{i}" for i in range(5)))[3]
  assert len(pathlib.PurePath(long).name) <= 200


@pytest.mark.parametrize("args,message", [
    (("--config.lr", "1e-3"), "config file '1e-3' not found (flags are --key=value, not --key"),
    ((MAIN, "workdirs/a", "workdirs/b"), "too many arguments"),
    ((MAIN, "-v"), "unknown option '-v'"),
])
def test_misplaced_arguments_fail_with_the_usage(args, message):
  result = local_sh(*args)
  assert result.returncode == 2
  assert message in result.stderr and "bash launch/local.sh" in result.stderr
  assert "big_vision_relu.train" not in result.stdout
