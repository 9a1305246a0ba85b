"""The package's floors and its lack of import cycles, checked by import-linter.

The contracts are in pyproject.toml (`[tool.importlinter]`): models at the bottom, experiment
tooling on top, every module of big_vision_relu on exactly one floor. import-linter reads every
import statement, those inside functions included, so an import hidden in a function to dodge a
cycle breaks the contract too.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

from conftest import ROOT

LINT_IMPORTS = pathlib.Path(sys.executable).parent / "lint-imports"


def _lint(root: pathlib.Path) -> subprocess.CompletedProcess:
  """Runs lint-imports on the package under `root` with `root`'s pyproject.toml."""
  env = {**os.environ, "PYTHONPATH": str(root)}
  return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=root, env=env,
                        capture_output=True, text=True, timeout=300, check=False)


def test_the_package_keeps_its_floors_and_has_no_import_cycle():
  result = _lint(ROOT)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "0 broken" in result.stdout


def test_an_upward_import_inside_a_function_is_caught(tmp_path):
  """The check can fail: a model module importing the trainer inside a function breaks it."""
  shutil.copytree(ROOT / "big_vision_relu", tmp_path / "big_vision_relu",
                  ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
  vit = tmp_path / "big_vision_relu" / "models" / "vit.py"
  vit.write_text(vit.read_text() + "\n\ndef _upward():\n  from big_vision_relu import train\n"
                 "  return train\n")
  result = _lint(tmp_path)
  assert result.returncode != 0
  assert "big_vision_relu.models.vit -> big_vision_relu.train" in result.stdout, result.stdout
