"""Every `from agentfly_jax... import name` / `import agentfly_jax...` in the scripts and the library,
module level or inside a function (lazy imports run only when their path does), names a module and
a name that exist. A refactor that moves a module fails here, not at a user's first run of the one
script that imported it lazily (experiments/learning_report.py imported rl.compile_cache after it
moved to rl/scale/)."""

import ast
import importlib
import os
import subprocess

import pytest
from train_cli import ROOT


def _tracked(prefixes) -> list[str]:
  out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
  return [p for p in out.stdout.splitlines() if p.startswith(prefixes) and os.path.isfile(os.path.join(ROOT, p))]


def project_imports(tree: ast.AST):
  """(line, module, name or None) of every absolute import of agentfly_jax / envservers in `tree`."""
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      if node.module.split(".")[0] in ("agentfly_jax", "envservers"):
        for alias in node.names:
          yield node.lineno, node.module, alias.name
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] in ("agentfly_jax", "envservers"):
          yield node.lineno, alias.name, None


def test_the_scan_sees_imports_inside_functions():
  src = "def f():\n  from agentfly_jax.rl.scale import compile_cache\n  import agentfly_jax.rl.loop\nimport os\n"
  assert list(project_imports(ast.parse(src))) == [
    (2, "agentfly_jax.rl.scale", "compile_cache"),
    (3, "agentfly_jax.rl.loop", None),
  ]


def _resolves(module: str, name: str | None) -> str | None:
  """None when `from module import name` (or `import module`) would work, else why not."""
  try:
    mod = importlib.import_module(module)
  except ModuleNotFoundError as e:
    if e.name and (module == e.name or module.startswith(e.name + ".")):
      return f"no module {e.name}"
    return None  # the module exists but needs an optional extra not installed here (e.g. aot-gpu)
  if name is None or name == "*" or hasattr(mod, name):
    return None
  try:
    importlib.import_module(f"{module}.{name}")
    return None
  except ModuleNotFoundError:
    return f"{module} has no {name}"


@pytest.mark.parametrize("folder", ["experiments/", "lab/", "agentfly_jax/", "tests/"])
def test_every_project_import_names_what_exists(folder):
  missing = []
  files = _tracked((folder,))
  assert files, folder
  for path in files:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    for line, module, name in project_imports(tree):
      why = _resolves(module, name)
      if why:
        missing.append(f"{path}:{line}: {why}")
  assert not missing, "imports of what does not exist: " + "; ".join(missing)
