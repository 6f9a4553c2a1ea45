"""The typed-section machinery of rl/spec.py: a `Section` dataclass base whose fields are type-checked
from their annotations (ints are not bools, floats take ints, tuples take lists) and whose errors name
the field as `config.<section>.<field>=<value>: why`."""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from typing import Any, ClassVar


def fail(field: str, value: Any, why: str):
  raise ValueError(f"config.{field}={value!r}: {why}")


class Section:
  """Base of the sections: type checks of every field from its annotation (ints are not bools,
  floats take ints, tuples take lists), then the section's own `check()`."""

  NAME: ClassVar[str] = ""

  def __post_init__(self):
    hints = typing.get_type_hints(type(self))
    for f in dataclasses.fields(self):
      object.__setattr__(self, f.name, _typed(f"{self.NAME}.{f.name}", getattr(self, f.name), hints[f.name]))
    self.check()

  @classmethod
  def parse(cls, values, where: str):
    """The section from a mapping (ConfigDict or dict); an unknown field is an error naming it."""
    return _parse(cls, values, where)

  def check(self) -> None:
    pass

  def field(self, name: str) -> str:
    return f"{self.NAME}.{name}"

  def need(self, name: str, ok: bool, why: str) -> None:
    if not ok:
      fail(self.field(name), getattr(self, name), why)

  def at_least(self, name: str, low: int, what: str = "") -> None:
    self.need(name, getattr(self, name) >= low, f"must be an integer >= {low}{what}")


def _typed(field: str, value: Any, hint: Any) -> Any:
  """`value` as the annotated type, or ValueError naming `field`."""
  if isinstance(hint, type) and issubclass(hint, Section):
    return value if isinstance(value, hint) else hint.parse(value, field)
  origin = typing.get_origin(hint)
  if hint is bool:
    ok = isinstance(value, bool)
  elif hint is int:
    ok = isinstance(value, int) and not isinstance(value, bool)
  elif hint is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    value = float(value) if ok else value
  elif hint is str:
    ok = isinstance(value, str)
  elif origin is tuple:
    ok = isinstance(value, (tuple, list))
    value = tuple(value) if ok else value
  elif origin is collections.abc.Mapping:
    ok = hasattr(value, "items")
    value = types.MappingProxyType(dict(value.to_dict() if hasattr(value, "to_dict") else value)) if ok else value
  else:  # a union (the task): checked by the owner
    return value
  if not ok:
    kinds = {bool: "a bool", int: "an integer", float: "a number", str: "a string"}
    fail(field, value, f"must be {kinds.get(hint, 'a list' if origin is tuple else 'a mapping')}")
  return value


def _parse(cls, values, where: str):
  """A section from a mapping (ConfigDict or dict); an unknown field is an error naming it."""
  if not hasattr(values, "items"):
    fail(where, values, f"must be a section with fields {[f.name for f in dataclasses.fields(cls)]}")
  values = dict(values.items())
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - known)
  if unknown:
    raise ValueError(f"config.{where}.{unknown[0]}: unknown field; {where} has {sorted(known)}")
  return cls(**values)


def view(cls, section: Section, **derived):
  """`cls` (a frozen dataclass of a jitted program's static settings, e.g. rl/core's `LossConfig`)
  as a view of the spec's `section`: each field of `cls` named like a field of `section` is the
  section's value, not a copy written out field by field; the others are `derived` (each given:
  a field neither in the section nor derived is an error, so no default of `cls` stands in for the
  run's value). `derived` names win over the section's (e.g. `loss.agg` "" = the algorithm's)."""
  names = [f.name for f in dataclasses.fields(cls)]
  in_section = {f.name for f in dataclasses.fields(section)}
  unknown = sorted(set(derived) - set(names))
  missing = [n for n in names if n not in derived and n not in in_section]
  if unknown or missing:
    raise TypeError(f"{cls.__name__} as a view of config.{section.NAME}: unknown {unknown}, not given {missing}")
  return cls(**{n: derived[n] if n in derived else getattr(section, n) for n in names})
