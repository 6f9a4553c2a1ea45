"""Tools by name: the built-ins, and user tools as `module:attribute`.

  get_tool("calculator")               # a built-in
  get_tool("my_pkg.my_task:lookup")    # a user's @tool
  list_tools()                         # the built-in names

Built-ins are listed here as "module:attribute" strings and imported on first use, so a listing
costs nothing and a built-in that needs an optional package fails only when asked for.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

BUILTIN_TOOLS: dict[str, str] = {
  "answer": "agentfly_jax.tools.builtin:answer",
  "calculator": "agentfly_jax.tools.builtin:calculator",
  "code_interpreter": "agentfly_jax.tools.builtin:code_interpreter",
  "retrieve": "agentfly_jax.tools.retrieval:retrieve",
  "web_search": "agentfly_jax.tools.web:web_search",
}


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


TOOLS = Listing("tool", BUILTIN_TOOLS)
register_builtin_tool = TOOLS.register
list_tools = TOOLS.names


def import_user_module(name: str):
  """`importlib.import_module(name)`; a user's module that is not importable from sys.path is
  then looked for in the current directory, as `python -m` and the REPL would find it (user task,
  tool and reward modules sit beside the command that names them)."""
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    cwd = os.getcwd()
    if e.name != name.partition(".")[0] or cwd in sys.path or "" in sys.path:
      raise
    sys.path.append(cwd)
    return importlib.import_module(name)


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


def get_tool(name: str):
  """The `Tool` named `name`: a built-in (see `list_tools()`) or 'module:function'."""
  from agentfly_jax.tools.tool import Tool

  obj = TOOLS.resolve(name)
  if not isinstance(obj, Tool):
    raise ValueError(f"tool {name!r} is a {type(obj).__name__}, not a @tool function")
  return obj
