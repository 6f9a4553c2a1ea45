"""The environment interface tools and rewards see, and who hands environments out.

A stateful tool (``@tool(stateful=True, env="python_sandbox")``) and an env-bound reward get
the chain's `Env` instance; the same instance for every call of one chain. Implementations:
a local in-process env (`LocalEnvProvider`, for tests and notebooks) and the env-server client
(`agentfly_jax.envs.manager`), which talks to trio `envservers` processes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable


@dataclasses.dataclass
class StepResult:
  """One step's outcome. `observation` is text, or content parts with images (agentfly_jax/vision/content.py)."""

  observation: str | list[dict]
  reward: float | None = None
  done: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
  """One environment instance, bound to one chain while acquired."""

  async def reset(self, row: dict | None = None) -> str | list[dict]:
    """Starts an episode for a dataset row; returns the first observation (may be ''; content parts with images)."""
    ...

  async def step(self, action: Any) -> StepResult:
    """Applies an action (e.g. code to run); errors come back as an observation, not a raise."""
    ...

  async def compute_reward(self, name: str, **kwargs) -> dict:
    """Runs an env-bound reward inside the environment; returns {'reward': float, ...}."""
    ...


@runtime_checkable
class EnvProvider(Protocol):
  """Acquires and releases env instances per chain (same chain -> same instance)."""

  async def acquire(self, env_name: str, chain_id: str) -> Env: ...

  async def release(self, env_name: str, chain_id: str) -> None: ...
