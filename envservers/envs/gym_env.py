"""`gymnasium`: any registered Gymnasium environment, one per instance, with text in and out.

The environment is `gymnasium.make(gym_id)`: the server option `gymnasium.gym_id` is the default,
a row's "gym_id" picks another (an id of the form "module:Name-v0" imports `module` first, which
is how a user's env registers itself). `reset(row)` (row fields "gym_id", "seed", "options")
returns the first observation as text; a step is one action. The text codec: a `Text`
observation or action passes as is; any other observation is sent as JSON (numpy values as
lists); a `Discrete` action is read as an integer, any other action space from JSON, and checked
against the space. A bad action is an observation naming what was wrong (the episode goes on);
an id that does not exist is a ValueError naming it (the instance stays usable). done = the
episode terminated or was truncated (or `max_steps` passed); the env reward `return` is the
episode's summed reward. Each instance runs in a worker process of its own (user env code:
a crash costs only that instance).

Options (`--env-opt gymnasium.NAME=VALUE`): gym_id, max_steps (default 200).
"""

from __future__ import annotations

import json
from typing import Any

from envservers.env import BlockingEnv, StepOutcome, env_reward
from envservers.registry import register_env


def _jsonable(value: Any) -> Any:
  if hasattr(value, "tolist"):
    return value.tolist()
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  return value


def encode_observation(space: Any, observation: Any) -> str:
  """An observation as text: a string as is, anything else as JSON."""
  if isinstance(observation, str):
    return observation
  return json.dumps(_jsonable(observation))


def decode_action(space: Any, action: Any) -> Any:
  """The action the env takes for the text (or value) sent; ValueError naming what was wrong."""
  import gymnasium
  import numpy as np

  if isinstance(space, gymnasium.spaces.Text):
    value = action if isinstance(action, str) else str(action)
  elif isinstance(space, gymnasium.spaces.Discrete):
    try:
      value = np.int64(int(str(action).strip()))
    except ValueError:
      raise ValueError(f"the action must be an integer in [{space.start}, {space.start + space.n - 1}], got {action!r}")
  else:
    try:
      value = json.loads(action) if isinstance(action, str) else action
    except ValueError:
      raise ValueError(f"the action must be JSON for the action space {space}, got {action!r}") from None
    value = np.asarray(value, dtype=space.dtype) if getattr(space, "dtype", None) is not None else value
  if not space.contains(value):
    raise ValueError(f"the action {action!r} is not in the action space {space}")
  return value


@register_env
class GymnasiumEnv(BlockingEnv):
  name = "gymnasium"
  run_in_subprocess = True

  def __init__(self, gym_id: str = "", max_steps: int = 200):
    if not isinstance(gym_id, str):
      raise ValueError(f"gymnasium option 'gym_id' must be a string, got {gym_id!r}")
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
      raise ValueError(f"gymnasium option 'max_steps' must be a positive int, got {max_steps!r}")
    self.default_id, self.max_steps = gym_id, max_steps
    self.env, self.gym_id = None, None
    self.steps, self.total, self.done = 0, 0.0, True

  def start_blocking(self) -> None:
    import gymnasium  # noqa: F401  (fail at start, not mid-episode, if it is missing)

  def _make(self, gym_id: str) -> None:
    import gymnasium

    try:
      env = gymnasium.make(gym_id)
    except (gymnasium.error.Error, ModuleNotFoundError, ImportError, AttributeError) as e:
      raise ValueError(f"field 'gym_id': {gym_id!r} is not a registered Gymnasium environment: {e}") from None
    self.close_blocking()
    self.env, self.gym_id = env, gym_id

  def reset_blocking(self, row: dict | None) -> str:
    row = row or {}
    gym_id = row.get("gym_id") or self.default_id
    if not isinstance(gym_id, str) or not gym_id:
      raise ValueError("field 'gym_id': the row names no Gymnasium id and the server has no default (gymnasium.gym_id)")
    seed = row.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
      raise ValueError(f"field 'seed' must be an int, got {seed!r}")
    if gym_id != self.gym_id:
      self._make(gym_id)
    observation, _ = self.env.reset(seed=seed, options=row.get("options"))
    self.steps, self.total, self.done = 0, 0.0, False
    return encode_observation(self.env.observation_space, observation)

  def step_blocking(self, action: Any) -> StepOutcome:
    if self.env is None or self.done:
      return StepOutcome("Error: the episode is over (or was never reset).", done=True, info={"error": "EpisodeOver"})
    try:
      value = decode_action(self.env.action_space, action)
    except ValueError as e:
      return StepOutcome(f"Error: {e}", info={"error": "BadAction"})
    observation, reward, terminated, truncated, _ = self.env.step(value)
    self.steps += 1
    self.total += float(reward)
    self.done = bool(terminated or truncated or self.steps >= self.max_steps)
    info = {"terminated": bool(terminated), "truncated": bool(truncated)}
    return StepOutcome(encode_observation(self.env.observation_space, observation), float(reward), self.done, info)

  @env_reward("return")
  def episode_return(self) -> dict:
    """The episode's summed reward, with its steps and whether it ended."""
    return {"reward": self.total, "steps": float(self.steps), "done": float(self.done)}

  def close_blocking(self) -> None:
    env, self.env, self.gym_id = self.env, None, None
    if env is not None:
      env.close()
