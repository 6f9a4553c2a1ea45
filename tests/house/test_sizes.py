"""Size rules of the house (issues #24, #43): no tracked Python file over MAX_FILE_LINES lines, no
function in agentfly_jax/rl/ over MAX_FUNCTION_LINES lines (def to last line, decorators not
counted; a nested function counts inside the function around it, a method on its own), and no
class in agentfly_jax/rl/ with more than MAX_CLASS_METHODS methods (`__init__` and properties not
counted: a class that grows past it is doing several jobs). Split what grows past them into named
functions / modules."""

import ast
import os
import subprocess

from train_cli import ROOT

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_CLASS_METHODS = 8
FUNCTION_RULE_DIR = "agentfly_jax/rl/"


def _tracked_python_files() -> list[str]:
  out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
  return [p for p in out.stdout.splitlines() if os.path.isfile(os.path.join(ROOT, p))]


def _outer_functions(tree: ast.AST):
  """(qualified name, lines) of every function not inside another function (methods included)."""

  def walk(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        yield prefix + child.name, child.end_lineno - child.lineno + 1
      elif isinstance(child, ast.ClassDef):
        yield from walk(child, prefix + child.name + ".")
      else:
        yield from walk(child, prefix)

  yield from walk(tree, "")


def _classes_and_methods(tree: ast.AST):
  """(class name, [its methods but `__init__` and properties]) of every class in `tree`."""
  for node in ast.walk(tree):
    if isinstance(node, ast.ClassDef):
      methods = [
        f.name
        for f in node.body
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        and f.name != "__init__"
        and not any(
          (isinstance(d, ast.Name) and d.id in ("property", "cached_property"))
          or (isinstance(d, ast.Attribute) and d.attr in ("setter", "cached_property"))
          for d in f.decorator_list
        )
      ]
      yield node.name, methods


def test_method_count_leaves_out_init_and_properties():
  src = (
    "class A:\n  def __init__(self): pass\n  @property\n  def p(self): return 1\n  @p.setter\n"
    "  def p(self, v): pass\n  def m(self): pass\n  async def n(self): pass\n"
  )
  assert list(_classes_and_methods(ast.parse(src))) == [("A", ["m", "n"])]


def _rl_trees():
  """(path, parsed module) of every tracked file under FUNCTION_RULE_DIR."""
  files = [p for p in _tracked_python_files() if p.startswith(FUNCTION_RULE_DIR)]
  assert files, f"no tracked files under {FUNCTION_RULE_DIR}"
  for path in files:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      yield path, ast.parse(f.read(), path)


def test_no_class_in_rl_has_more_methods_than_the_limit():
  over = []
  for path, tree in _rl_trees():
    over += [f"{path}::{c}: {len(m)} methods" for c, m in _classes_and_methods(tree) if len(m) > MAX_CLASS_METHODS]
  assert not over, f"classes over {MAX_CLASS_METHODS} methods (split the jobs into functions / classes): " + "; ".join(
    over
  )


def test_outer_functions_measure_nested_ones_inside():
  src = "class A:\n  def m(self):\n    def inner():\n      pass\n    return 1\n\ndef f():\n  pass\n"
  assert list(_outer_functions(ast.parse(src))) == [("A.m", 4), ("f", 2)]


def test_no_tracked_python_file_is_over_the_line_limit():
  files = _tracked_python_files()
  assert len(files) > 100, files  # git sees the tree
  over = []
  for path in files:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      n = len(f.read().splitlines())
    if n > MAX_FILE_LINES:
      over.append(f"{path}: {n} lines")
  assert not over, f"files over {MAX_FILE_LINES} lines (split them into modules): " + "; ".join(over)


def test_no_function_in_rl_is_over_the_line_limit():
  over = []
  for path, tree in _rl_trees():
    over += [f"{path}::{name}: {n} lines" for name, n in _outer_functions(tree) if n > MAX_FUNCTION_LINES]
  assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split them into named functions): " + "; ".join(over)
