"""Built-in tasks (dataset generator + tools + reward + demonstration policy), by name."""
from __future__ import annotations

import importlib

_TASKS = {"lookup": "agentfly_jax.tasks.lookup"}


def get_task(name: str):
  """The task module registered under `name` (it defines make_rows, tools, a reward, ...)."""
  if name not in _TASKS:
    raise ValueError(f"unknown task {name!r}; known tasks: {sorted(_TASKS)}")
  return importlib.import_module(_TASKS[name])


__all__ = ["get_task"]
