"""The experiments subpackage's boundaries: the library never imports it, and the study's run
status comes without the figures' matplotlib."""
import ast
import subprocess
import sys

from conftest import ROOT

LIBRARY = ROOT / "big_vision_relu"


def _imported_modules(path) -> set[str]:
  """The absolute module names `path` imports (`from a import b` counts as a and a.b)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def test_the_library_never_imports_experiments():
  offenders = {
      str(path.relative_to(ROOT)): sorted(
          n for n in _imported_modules(path) if n.startswith("big_vision_relu.experiments"))
      for path in LIBRARY.rglob("*.py") if LIBRARY / "experiments" not in path.parents}
  assert {p: n for p, n in offenders.items() if n} == {}


def test_the_study_loads_no_matplotlib():
  """Nor does any study's plan (a study's report module is imported only to report)."""
  code = ("import sys, big_vision_relu.experiments.study\n"
          "from big_vision_relu.experiments import plans\n"
          "for name in plans.names(): plans.load(name)\n"
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        check=True, timeout=300)
  assert done.stdout.strip() == "[]"
