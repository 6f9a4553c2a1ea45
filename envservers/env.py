"""Server-side environment types: the base classes, env-bound rewards, and the registry.

An env type is a class with async `start`, `reset(row)`, `step(action)`, `close` and env-bound
rewards declared with `@env_reward`. Code that blocks (a simulator, a JVM call) subclasses
`BlockingEnv` and writes plain methods; they run in worker threads so one slow env never stalls
the server. An env that runs user code in a child process (the Python sandbox) is async and
reports its process id in `worker_pid` so a crashed worker can be detected and recycled.
Env types are registered by name in `envservers.registry`.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, ClassVar

import trio


class EnvCrashed(Exception):
  """The instance is unusable (its worker died or timed out); the pool recycles it."""


@dataclasses.dataclass
class StepOutcome:
  """One step's result. `observation` is a str or a list of text / image parts (envservers.images)."""

  observation: str | list[dict[str, Any]]
  reward: float | None = None
  done: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_wire(self) -> dict[str, Any]:
    return {"observation": self.observation, "reward": self.reward, "done": self.done, "info": self.info}


def env_reward(name: str | None = None):
  """Marks an env method as an env-bound reward: `compute_reward(name, **kwargs)` calls it.

  The method returns a float or a dict with a float 'reward' (other keys are metrics).
  """

  def mark(fn):
    fn._env_reward_name = name or fn.__name__
    return fn

  return mark


class ServerEnv:
  """Base class of env types (async methods). One instance serves one chain at a time.

  Class attributes:
    name: the env type name clients use (e.g. "python_sandbox").
    reusable: if True, a released instance is kept warm for the next chain (its `reset` starts
      a fresh episode); if False it is closed and replaced on release.
    call_timeout_s: default wall-clock limit of one call; exceeding it recycles the instance.
  """

  name: ClassVar[str] = ""
  reusable: ClassVar[bool] = True
  call_timeout_s: ClassVar[float] = 60.0

  def __init__(self, **options: Any):
    if options:
      raise TypeError(f"env {self.name!r} takes no options, got {sorted(options)}")

  @property
  def worker_pid(self) -> int | None:
    """The pid of the process running this instance's code, if it has its own."""
    return None

  def alive(self) -> bool:
    """False if the instance died while idle (the pool then replaces it before handing it out)."""
    return True

  async def start(self) -> None:
    """Makes the instance ready (warm). Called once before first use."""

  async def reset(self, row: dict | None) -> str | list[dict[str, Any]]:
    """Starts an episode for a dataset row; returns the first observation (a str or a list of parts)."""
    return ""

  async def step(self, action: Any) -> StepOutcome:
    raise NotImplementedError

  async def close(self) -> None:
    """Frees everything the instance holds. Must not raise."""

  @classmethod
  def reward_names(cls) -> list[str]:
    return sorted(getattr(m, "_env_reward_name") for _, m in inspect.getmembers(cls) if hasattr(m, "_env_reward_name"))

  async def compute_reward(self, name: str, **kwargs) -> dict[str, Any]:
    """Runs the env-bound reward `name`; returns {'reward': float, ...}."""
    result = reward_method(self, name)(**kwargs)
    if inspect.isawaitable(result):
      result = await result
    return reward_dict(name, result)


def reward_method(env: Any, name: str) -> Callable:
  """The bound method of `env` marked `@env_reward(name)`; ValueError naming the known ones."""
  for _, method in inspect.getmembers(env):
    if getattr(method, "_env_reward_name", None) == name:
      return method
  raise ValueError(f"env {env.name!r} has no reward {name!r}; it has {env.reward_names()}")


def reward_dict(name: str, result: Any) -> dict[str, Any]:
  """An env reward's return value (a float, or a dict with a float 'reward' and metrics) as
  {'reward': float, **metrics}; TypeError naming the reward otherwise."""
  if isinstance(result, dict):
    if not isinstance(result.get("reward"), (int, float)) or isinstance(result.get("reward"), bool):
      raise TypeError(f"env reward {name!r} returned a dict without a float 'reward': {result!r}")
    return {**result, "reward": float(result["reward"])}
  if isinstance(result, (int, float)) and not isinstance(result, bool):
    return {"reward": float(result)}
  raise TypeError(f"env reward {name!r} returned {type(result).__name__}, expected float or dict")


class BlockingEnv(ServerEnv):
  """An env written with blocking methods; each call runs in a worker thread.

  Subclasses override `start_blocking` (slow set-up, e.g. launching a simulator),
  `reset_blocking`, `step_blocking`, `close_blocking` (plain functions); env rewards may be plain
  methods too (they also run in a thread). With `run_in_subprocess = True` each instance runs in
  a process of its own instead (envservers.worker): a crash or hang in env code then costs only
  that instance, which the pool kills and replaces.
  """

  run_in_subprocess: ClassVar[bool] = False

  def start_blocking(self) -> None:
    pass

  async def start(self):
    await trio.to_thread.run_sync(self.start_blocking, abandon_on_cancel=True)

  def reset_blocking(self, row: dict | None) -> str:
    return ""

  def step_blocking(self, action: Any) -> StepOutcome:
    raise NotImplementedError

  def close_blocking(self) -> None:
    pass

  async def reset(self, row):
    return await trio.to_thread.run_sync(self.reset_blocking, row, abandon_on_cancel=True)

  async def step(self, action):
    return await trio.to_thread.run_sync(self.step_blocking, action, abandon_on_cancel=True)

  async def close(self):
    try:
      await trio.to_thread.run_sync(self.close_blocking, abandon_on_cancel=True)
    except Exception:  # close never raises
      pass

  async def compute_reward(self, name, **kwargs):
    method = reward_method(self, name)
    if inspect.iscoroutinefunction(method):
      result = await method(**kwargs)
    else:
      result = await trio.to_thread.run_sync(lambda: method(**kwargs), abandon_on_cancel=True)
    return reward_dict(name, result)
