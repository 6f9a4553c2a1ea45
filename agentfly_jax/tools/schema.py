"""JSON schemas (OpenAI function format) from a Python signature + Google-style docstring, and
checking a model's arguments against the type hints.

  def get_weather(city: str, days: int = 1) -> str:
    '''Weather forecast for a city.

    Args:
      city: the city name.
      days (int): how many days ahead.
    '''
  function_schema(get_weather) == {"type": "function", "function": {"name": "get_weather",
      "description": "Weather forecast for a city.", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "description": "the city name."},
                     "days": {"type": "integer", "description": "how many days ahead."}},
      "required": ["city"]}}}
"""

from __future__ import annotations

import collections.abc
import inspect
import re
import types
import typing
from typing import Any, Callable, Literal, Union

_SECTION_RE = re.compile(
  r"^\s*(Args|Arguments|Parameters|Returns|Return|Yields|Raises|"
  r"Examples?|Notes?|Attributes)\s*:\s*$"
)
_ARG_RE = re.compile(r"^(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")

_PRIMITIVES = {
  str: "string",
  int: "integer",
  float: "number",
  bool: "boolean",
  dict: "object",
  list: "array",
  tuple: "array",
}


def parse_google_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
  """Returns (description, {arg name: arg description}) of a Google-style docstring."""
  if not doc:
    return "", {}
  lines = inspect.cleandoc(doc).splitlines()
  description, args = [], {}
  section, current, arg_indent = None, None, None
  for line in lines:
    m = _SECTION_RE.match(line)
    if m:
      section, current, arg_indent = m.group(1), None, None
      continue
    if section is None:
      description.append(line)
      continue
    if section not in ("Args", "Arguments", "Parameters") or not line.strip():
      continue
    indent = len(line) - len(line.lstrip())
    am = _ARG_RE.match(line.strip())
    if am and (arg_indent is None or indent <= arg_indent):
      arg_indent = indent
      current = am.group(1).lstrip("*")
      args[current] = am.group(3).strip()
    elif current is not None:
      args[current] = (args[current] + " " + line.strip()).strip()
  paragraphs = re.split(r"\n\s*\n", "\n".join(description).strip())
  text = "\n\n".join(" ".join(l.strip() for l in p.splitlines()) for p in paragraphs)
  return text.strip(), args


def _is_optional(hint) -> tuple[bool, Any]:
  origin = typing.get_origin(hint)
  if origin in (Union, types.UnionType):
    rest = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(rest) < len(typing.get_args(hint)):
      return True, (rest[0] if len(rest) == 1 else Union[tuple(rest)])
  return False, hint


def type_schema(hint) -> dict:
  """JSON schema of a type hint (str, int, float, bool, list[X], dict, Literal, Optional, ...)."""
  if hint is inspect.Parameter.empty or hint is Any:
    return {}
  optional, inner = _is_optional(hint)
  if optional:
    schema = type_schema(inner)
    if "type" in schema and isinstance(schema["type"], str):
      schema = {**schema, "nullable": True}
    return schema
  if hint in _PRIMITIVES:
    return {"type": _PRIMITIVES[hint]}
  origin = typing.get_origin(hint)
  if origin is Literal:
    values = list(typing.get_args(hint))
    kinds = {type(v) for v in values}
    schema = {"enum": values}
    if len(kinds) == 1 and next(iter(kinds)) in _PRIMITIVES:
      schema = {"type": _PRIMITIVES[next(iter(kinds))], "enum": values}
    return schema
  if origin in (list, tuple, collections.abc.Sequence):
    args = typing.get_args(hint)
    schema = {"type": "array"}
    if args and args[0] is not Ellipsis:
      schema["items"] = type_schema(args[0])
    return schema
  if origin is dict:
    return {"type": "object"}
  if origin in (Union, types.UnionType):
    return {"anyOf": [type_schema(a) for a in typing.get_args(hint)]}
  return {}


def function_schema(
  fn: Callable, name: str | None = None, description: str | None = None, skip_params: tuple[str, ...] = ()
) -> dict:
  """OpenAI function-format schema of `fn` (parameters in `skip_params` are left out)."""
  doc_description, arg_docs = parse_google_docstring(fn.__doc__)
  try:
    hints = typing.get_type_hints(fn)
  except Exception:  # unresolvable forward refs: fall back to raw annotations
    hints = {}
  properties, required = {}, []
  for pname, param in inspect.signature(fn).parameters.items():
    if pname in skip_params or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
      continue
    prop = type_schema(hints.get(pname, param.annotation))
    if pname in arg_docs and arg_docs[pname]:
      prop["description"] = arg_docs[pname]
    properties[pname] = prop
    if param.default is inspect.Parameter.empty:
      required.append(pname)
  return {
    "type": "function",
    "function": {
      "name": name or fn.__name__,
      "description": description if description is not None else doc_description,
      "parameters": {"type": "object", "properties": properties, "required": required},
    },
  }


def _matches(value, hint) -> bool:
  if hint is inspect.Parameter.empty or hint is Any:
    return True
  optional, inner = _is_optional(hint)
  if optional:
    return value is None or _matches(value, inner)
  origin = typing.get_origin(hint)
  if origin is Literal:
    return value in typing.get_args(hint)
  if origin in (Union, types.UnionType):
    return any(_matches(value, a) for a in typing.get_args(hint))
  if hint is bool:
    return isinstance(value, bool)
  if hint is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if hint is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if hint is str:
    return isinstance(value, str)
  if hint in (list, tuple) or origin in (list, tuple):
    if not isinstance(value, list):
      return False
    args = typing.get_args(hint)
    if args and args[0] is not Ellipsis:
      return all(_matches(v, args[0]) for v in value)
    return True
  if hint is dict or origin is dict:
    return isinstance(value, dict)
  if isinstance(hint, type):
    return isinstance(value, hint)
  return True


def check_arguments(
  fn_name: str, signature: inspect.Signature, hints: dict, arguments: dict, skip_params: tuple[str, ...] = ()
) -> str | None:
  """Returns an error message naming the tool and argument, or None if `arguments` fit."""
  params = {k: p for k, p in signature.parameters.items() if k not in skip_params}
  accepts_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
  named = {k: p for k, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
  unknown = [k for k in arguments if k not in named]
  if unknown and not accepts_any:
    return (
      f"tool '{fn_name}' got unknown argument(s) {', '.join(map(repr, unknown))}; "
      f"it accepts {', '.join(map(repr, named)) or 'no arguments'}"
    )
  missing = [k for k, p in named.items() if p.default is inspect.Parameter.empty and k not in arguments]
  if missing:
    return f"tool '{fn_name}' is missing required argument(s) {', '.join(map(repr, missing))}"
  for k, v in arguments.items():
    if k not in named:
      continue
    hint = hints.get(k, named[k].annotation)
    if not _matches(v, hint):
      expected = type_schema(hint).get("type") or getattr(hint, "__name__", str(hint))
      return f"tool '{fn_name}' argument '{k}' must be of type {expected}, got {type(v).__name__} {v!r:.80}"
  return None
