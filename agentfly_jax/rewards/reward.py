"""`@reward`: turn a function into a reward the rollout computes when a chain finishes.

  @reward
  def exact(prediction: str, answer: str) -> float:
    return float(prediction.strip() == answer.strip())

  @reward(name="code_ok", env="python_sandbox")
  async def code_ok(prediction, trajectory, env, tests) -> dict:
    out = await env.step(tests)
    return {"reward": float("OK" in out.observation), "num_turns": len(trajectory)}

Parameters are filled by name: `prediction` (the final answer text), `trajectory` (the chat
messages), `row` (the whole dataset row), `env` (the chain's environment, same instance as its
tools; needs `env=`), and any other name from the dataset row's fields (`**kwargs` receives all
remaining fields). Return a number, or a dict with "reward" (other keys become metrics). Sync
and async (trio) functions both work.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Any, Callable

import trio

_SPECIAL = ("prediction", "trajectory", "row", "env")


class Reward:
  """A reward function plus how to call it from a finished chain. `group` True: a reward of a row's chains
  together (`compute_group`, rewards/judge.py), computed when the group's last chain ends."""

  group = False

  def __init__(self, fn: Callable, *, name: str | None = None, env: str | None = None):
    if not callable(fn):
      raise TypeError(f"@reward: expected a function, got {type(fn).__name__}")
    self.fn = fn
    self.name = name or getattr(fn, "__name__", "reward")
    self.env_name = env
    self.signature = inspect.signature(fn)
    self.is_async = inspect.iscoroutinefunction(fn)
    if "env" in self.signature.parameters and env is None:
      raise ValueError(f"@reward {self.name!r}: a parameter named 'env' needs env='<env name>'")
    functools.update_wrapper(self, fn)

  def __repr__(self):
    env = f", env={self.env_name!r}" if self.env_name else ""
    return f"<Reward {self.name}({', '.join(self.signature.parameters)}){env}>"

  def __call__(self, *args, **kwargs):
    """Calls the function itself (a coroutine for async rewards)."""
    return self.fn(*args, **kwargs)

  def bind(self, prediction: Any, trajectory: list, row: dict, env: Any = None) -> dict:
    """The keyword arguments of one call; raises KeyError naming a missing dataset field."""
    sources = {"prediction": prediction, "trajectory": trajectory, "row": row, "env": env}
    kwargs, used = {}, set()
    var_keyword = False
    for pname, param in self.signature.parameters.items():
      if param.kind == param.VAR_KEYWORD:
        var_keyword = True
        continue
      if param.kind == param.VAR_POSITIONAL:
        continue
      if pname in _SPECIAL:
        kwargs[pname] = sources[pname]
      elif pname in row:
        kwargs[pname] = row[pname]
        used.add(pname)
      elif param.default is inspect.Parameter.empty:
        raise KeyError(
          f"reward '{self.name}' needs dataset field '{pname}', which the row lacks (row fields: {sorted(row)})"
        )
    if var_keyword:
      for k, v in row.items():
        if k not in used and k not in kwargs:
          kwargs[k] = v
    return kwargs

  async def compute(
    self,
    prediction: Any,
    trajectory: list,
    row: dict,
    env: Any = None,
    thread_limiter: trio.CapacityLimiter | None = None,
  ) -> dict:
    """Runs the reward; returns {"reward": float, **metrics}. Raises on bad return values."""
    kwargs = self.bind(prediction, trajectory, row, env)
    if self.is_async:
      value = await self.fn(**kwargs)
    else:
      value = await trio.to_thread.run_sync(functools.partial(self.fn, **kwargs), limiter=thread_limiter)
    return normalize_reward(self.name, value)


def normalize_reward(name: str, value: Any) -> dict:
  """A reward's return value as {"reward": float, **metrics}; errors name the reward."""
  if isinstance(value, dict):
    if "reward" not in value:
      raise ValueError(f"reward '{name}' returned a dict without a 'reward' key: {sorted(value)}")
    out = dict(value)
    out["reward"] = _as_float(name, value["reward"])
    return out
  return {"reward": _as_float(name, value)}


def _as_float(name: str, value: Any) -> float:
  if isinstance(value, (bool, numbers.Real)) or hasattr(value, "__float__"):
    try:
      result = float(value)
    except (TypeError, ValueError):
      result = None
    if result is not None:
      if not math.isfinite(result):
        raise ValueError(f"reward '{name}' returned a non-finite value {result}")
      return result
  raise TypeError(
    f"reward '{name}' must return a number or a dict with 'reward', got {type(value).__name__} {value!r:.80}"
  )


def reward(fn: Callable | None = None, *, name: str | None = None, env: str | None = None):
  """Decorator making a `Reward`; bare (`@reward`) or with options (`@reward(name=..., env=...)`).

  Args:
    name: reward name (default: the function name).
    env: environment name whose chain instance is passed as the `env` parameter.
  """

  def wrap(f):
    return Reward(f, name=name, env=env)

  return wrap(fn) if fn is not None else wrap
