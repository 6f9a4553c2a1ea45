"""A user's code by name: modules (a dotted name, or a .py file) and `module:attribute` references,
and `Listing`, the by-name registry of one kind of object (tools, rewards) built on them.

  module = import_user_module("my_pkg.my_task")       # or "my_task.py", "dir/my_task.py"
  fn = resolve_object("my_task:shout", kind="tool", builtins={})
  TOOLS = Listing("tool", {"calculator": "agentfly_jax.tools.builtin:calculator"})

Imports nothing of agentfly_jax: tools, rewards and tasks all resolve users' names through it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any


class Listing:
  """Objects of one kind by name (the one registry helper of tools and rewards): built-ins as
  "module:attribute" strings in `builtins` (imported on first use), users' as `module:attribute`."""

  def __init__(self, kind: str, builtins: dict[str, str]):
    self.kind, self.builtins = kind, builtins

  def register(self, name: str, target: str) -> None:
    """Adds `name` -> "module:attribute" to the built-in listing (for packages that ship them)."""
    if ":" not in target:
      raise ValueError(f"register_builtin_{self.kind}({name!r}): target must be 'module:attribute', got {target!r}")
    self.builtins[name] = target

  def names(self) -> list[str]:
    """The names known without a module path."""
    return sorted(self.builtins)

  def resolve(self, spec: str) -> Any:
    """A built-in by name, or `module:attribute` imported (`resolve_object`)."""
    return resolve_object(spec, kind=self.kind, builtins=self.builtins)


def import_user_module(name: str):
  """A user's task / tool / reward module, without touching sys.path.

  `name` is a module path (`my_task`, `my_pkg.my_task`), imported as such; or a file path the user
  gives (`my_task.py`, `dir/my_task.py`), loaded from that file. A module path that does not import
  from sys.path is then looked for in the current directory (`./my_task.py`, or the package
  `./my_pkg/`), where `python -m` and the REPL would find it: user modules sit beside the command
  that names them. A module loaded from a file is registered in sys.modules under its name."""
  if name.endswith(".py") or os.sep in name or (os.altsep and os.altsep in name):
    return load_module_file(name)
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    top = name.partition(".")[0]
    if e.name != top:
      raise
    here = _in_current_directory(top)
    if here is None:
      raise
    load_module_file(here, top)
    return importlib.import_module(name)


def _in_current_directory(top: str) -> str | None:
  """`./top.py`, or `./top/__init__.py` (a package), if either exists."""
  for path in (f"{top}.py", os.path.join(top, "__init__.py")):
    if os.path.isfile(path):
      return os.path.abspath(path)
  return None


def load_module_file(path: str, name: str | None = None):
  """The module in file `path` (a package's `__init__.py` loads the package), executed and
  registered in sys.modules as `name` (default: the file's name without `.py`)."""
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no file {path}")
  package = os.path.basename(path) == "__init__.py"
  if name is None:
    name = os.path.basename(os.path.dirname(path) if package else path).removesuffix(".py")
  search = [os.path.dirname(path)] if package else None
  spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=search)
  if spec is None or spec.loader is None:
    raise ImportError(f"cannot load {path} as a module")
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # so 'name:function' references (and the module's own imports of it) resolve
  try:
    spec.loader.exec_module(module)
  except BaseException:
    sys.modules.pop(name, None)
    raise
  return module


def resolve_object(spec: str, *, kind: str, builtins: dict[str, str]) -> Any:
  """A built-in by name, or `module:attribute` (also `module.attribute`) imported; clear errors."""
  if not isinstance(spec, str) or not spec.strip():
    raise ValueError(f"{kind} name must be a non-empty string, got {spec!r}")
  spec = spec.strip()
  target = builtins.get(spec)
  if target is None:
    if ":" in spec:
      target = spec
    elif "." in spec:
      module, _, attr = spec.rpartition(".")
      target = f"{module}:{attr}"
    else:
      raise ValueError(
        f"unknown {kind} {spec!r}; built-in {kind}s: {sorted(builtins)} (a user {kind} is named as 'module:function')"
      )
  module_name, _, attr = target.partition(":")
  try:
    module = import_user_module(module_name)
  except Exception as e:  # noqa: BLE001 — any import failure is the user's module failing
    raise ValueError(f"{kind} {spec!r}: module {module_name!r} does not import: {type(e).__name__}: {e}") from e
  try:
    obj = getattr(module, attr)
  except AttributeError:
    raise ValueError(f"{kind} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
  return obj
