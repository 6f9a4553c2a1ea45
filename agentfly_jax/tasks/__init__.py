"""Built-in tasks (dataset generator + tools + reward + demonstration policy), by name; the one task
type, `TaskSpec`, constructed as `Task(...)` for a user's own task, or read from a task module by
`from_module` (tasks/contract.py)."""

from __future__ import annotations

import importlib

from agentfly_jax.tasks.contract import Task, TaskSpec, check_agent_fn, from_module, task_spec  # noqa: F401

_TASKS = {
  "lookup": "agentfly_jax.tasks.lookup",
  "multihop_qa": "agentfly_jax.tasks.multihop_qa",
  "math_calc": "agentfly_jax.tasks.math_calc",
  "code": "agentfly_jax.tasks.code_tasks",
  "webshop": "agentfly_jax.tasks.webshop",
  "textworld": "agentfly_jax.tasks.textworld",
  "scienceworld": "agentfly_jax.tasks.scienceworld",
  "arithmetic": "agentfly_jax.tasks.arithmetic",
  "arithmetic_brief": "agentfly_jax.tasks.arithmetic_brief",
  "swe": "agentfly_jax.tasks.swe",
  "multihop_qa_brief": "agentfly_jax.tasks.multihop_qa_brief",
  "multihop_qa_brief_2hop": "agentfly_jax.tasks.multihop_qa_brief_2hop",
  "webshop_brief": "agentfly_jax.tasks.webshop_brief",
  "visual_qa": "agentfly_jax.tasks.visual_qa",
  "visual_qa_colors": "agentfly_jax.tasks.visual_qa_colors",
}


def task_names() -> tuple[str, ...]:
  """The built-in task names."""
  return tuple(_TASKS)


def get_task(name: str):
  """The task module registered under `name` (it defines make_rows, tools, a reward, ...)."""
  if name not in _TASKS:
    raise ValueError(f"unknown task {name!r}; known tasks: {sorted(_TASKS)}")
  return importlib.import_module(_TASKS[name])


__all__ = ["get_task", "task_names", "Task", "TaskSpec", "from_module", "task_spec"]
