"""Small env types for tests, benchmarks and wiring checks (no external dependencies).

- `echo`: step(action) returns the action as text (JSON for non-strings).
- `counter`: counts steps; done after `row["max_steps"]` (default 3); reward `steps`.
- `sleep`: step({"sleep_s": s}) awaits s seconds (I/O-bound) and returns "slept"; reward `one`.
- `blocking_sleep`: like `sleep` but with `time.sleep` in a worker thread (a blocking env).
- `worker_echo`: a blocking env in a process of its own (`run_in_subprocess`): echoes; the
  action "crash" exits the process, {"sleep_s": s} blocks, "pid" returns its pid; it also prints
  to stdout (which must not reach the protocol).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import trio

from envservers.env import BlockingEnv, ServerEnv, StepOutcome, env_reward
from envservers.registry import register_env


def _as_text(action: Any) -> str:
  return action if isinstance(action, str) else json.dumps(action, sort_keys=True)


@register_env
class EchoEnv(ServerEnv):
  name = "echo"

  async def step(self, action):
    return StepOutcome(observation=_as_text(action), info={"pid": os.getpid()})

  @env_reward("length")
  def length(self, text: str = "") -> float:
    return float(len(text))


@register_env
class CounterEnv(ServerEnv):
  name = "counter"

  def __init__(self, **options):
    super().__init__(**options)
    self.count = 0
    self.max_steps = 3

  async def reset(self, row):
    self.count = 0
    if row is not None:
      max_steps = row.get("max_steps", 3)
      if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
        raise ValueError(f"row field 'max_steps' must be a positive int, got {max_steps!r}")
      self.max_steps = max_steps
    else:
      self.max_steps = 3
    return f"count=0 max_steps={self.max_steps}"

  async def step(self, action):
    self.count += 1
    done = self.count >= self.max_steps
    return StepOutcome(observation=f"count={self.count}", reward=1.0 if done else 0.0, done=done)

  @env_reward("steps")
  def steps(self, scale: float = 1.0) -> dict:
    if not isinstance(scale, (int, float)):
      raise TypeError(f"argument 'scale' must be a number, got {type(scale).__name__}")
    return {"reward": self.count * float(scale), "count": self.count}


def _sleep_seconds(action: Any) -> float:
  seconds = action.get("sleep_s", 0.0) if isinstance(action, dict) else action
  if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds <= 600:
    raise ValueError(f"action 'sleep_s' must be a number of seconds in [0, 600], got {seconds!r}")
  return float(seconds)


@register_env
class SleepEnv(ServerEnv):
  name = "sleep"

  async def step(self, action):
    await trio.sleep(_sleep_seconds(action))
    return StepOutcome(observation="slept")

  @env_reward("one")
  async def one(self) -> float:
    return 1.0


@register_env
class BlockingSleepEnv(BlockingEnv):
  name = "blocking_sleep"

  def step_blocking(self, action):
    time.sleep(_sleep_seconds(action))
    return StepOutcome(observation="slept", info={"thread": __import__("threading").get_ident()})


@register_env
class WorkerEchoEnv(BlockingEnv):
  name = "worker_echo"
  run_in_subprocess = True
  call_timeout_s = 5.0

  def __init__(self, prefix: str = "", **options):
    super().__init__(**options)
    if not isinstance(prefix, str):
      raise TypeError(f"worker_echo option 'prefix' must be a string, got {type(prefix).__name__}")
    self.prefix = prefix
    self.steps = 0

  def reset_blocking(self, row):
    self.steps = 0
    return f"{self.prefix}ready"

  def step_blocking(self, action):
    self.steps += 1
    print("noise on stdout", flush=True)
    if action == "crash":
      os._exit(3)
    if action == "pid":
      return StepOutcome(observation=str(os.getpid()))
    if isinstance(action, dict) and "sleep_s" in action:
      time.sleep(_sleep_seconds(action))
      return StepOutcome(observation="slept")
    if action == "raise":
      raise ValueError("asked to raise")
    return StepOutcome(observation=self.prefix + _as_text(action), info={"steps": self.steps})

  @env_reward("steps")
  def steps_reward(self) -> float:
    return float(self.steps)
