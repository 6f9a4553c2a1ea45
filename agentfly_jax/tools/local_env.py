"""An in-process `EnvProvider` and a small in-process env, for tests and notebooks.

  provider = LocalEnvProvider({"memory": LocalMemoryEnv})
  trajectories = run_rollout(agent, rows, ..., env_provider=provider)

Real environments (the Python sandbox, search, text worlds) live in env-server processes and
are reached through `agentfly_jax.envs`; this provider only builds plain Python objects.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from agentfly_jax.envs.base import StepResult


class LocalEnvProvider:
  """Builds one env per (env name, chain id) from a factory; same chain -> same instance.

  Attributes:
    acquired: {(env_name, chain_id): env} currently held.
    num_created, num_released: counters (tests check that every chain releases).
  """

  def __init__(self, factories: Mapping[str, Callable[[], Any]]):
    self.factories = dict(factories)
    self.acquired: dict[tuple[str, str], Any] = {}
    self.num_created = 0
    self.num_released = 0

  async def acquire(self, env_name: str, chain_id: str):
    key = (env_name, str(chain_id))
    if key not in self.acquired:
      if env_name not in self.factories:
        raise KeyError(f"LocalEnvProvider: no environment named {env_name!r} (known: {sorted(self.factories)})")
      self.acquired[key] = self.factories[env_name]()
      self.num_created += 1
    return self.acquired[key]

  async def release(self, env_name: str, chain_id: str) -> None:
    env = self.acquired.pop((env_name, str(chain_id)), None)
    if env is not None:
      self.num_released += 1
      close = getattr(env, "aclose", None)
      if close is not None:
        await close()


class LocalMemoryEnv:
  """A key-value memory: `step({"op": "set", "key": k, "value": v})` / `{"op": "get", "key": k}`.

  Its reward (`compute_reward("num_keys")`) is the number of stored keys; `reset(row)` clears it
  and stores the row (so env-bound rewards can read it).
  """

  def __init__(self):
    self.memory: dict[str, Any] = {}
    self.row: dict | None = None
    self.num_steps = 0

  async def reset(self, row: dict | None = None) -> str:
    self.memory.clear()
    self.row = row
    self.num_steps = 0
    return ""

  async def step(self, action: Any) -> StepResult:
    self.num_steps += 1
    if not isinstance(action, Mapping) or action.get("op") not in ("set", "get"):
      return StepResult(observation=f"Error: action must be {{'op': 'set'|'get', ...}}, got {action!r}")
    key = str(action.get("key"))
    if action["op"] == "set":
      self.memory[key] = action.get("value")
      return StepResult(observation=f"stored {key}")
    if key not in self.memory:
      return StepResult(observation=f"Error: no value stored under {key!r}")
    return StepResult(observation=str(self.memory[key]))

  async def compute_reward(self, name: str, **kwargs) -> dict:
    if name != "num_keys":
      return {"reward": 0.0, "error": f"unknown reward {name!r}"}
    return {"reward": float(len(self.memory))}
