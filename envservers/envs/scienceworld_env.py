"""`scienceworld`: ScienceWorld tasks (PyPI `scienceworld`, needs Java 17), one JVM per instance.

A row: {"task_name", "variation", optional "simplification" (e.g. "easy")}. `reset` loads the
task variation (or only restarts it when this JVM has it loaded) and returns the task description
and the first observation; a step is one command; the step reward is the score change / 100 (a
solved task sums to 1.0); done when the task completes or fails (score < 0) or at the step
limit. The instance is reusable: its JVM serves chain after chain. Query actions (not moves):
{"query": "valid_actions"} (ScienceWorld's valid action-object combinations) and
{"query": "gold_actions"} (its gold action sequence, the expert). `info` of a reset-less
{"query": "timing"} gives the JVM start-up and last load/reset seconds.

Each instance runs in a worker process (`run_in_subprocess`); if the JVM dies, the call raises
EnvCrashed, the worker exits, the chain gets an error observation and the pool recycles it.

Options (`--env-opt scienceworld.NAME=VALUE`): step_limit (default 100).
"""

from __future__ import annotations

import time
from typing import Any

from envservers.env import BlockingEnv, EnvCrashed, StepOutcome, env_reward
from envservers.registry import register_env

SPLITS = ("train", "dev", "test")


def _call_jvm(what: str, fn, *args):
  """Runs a call into the JVM; a dead JVM (py4j errors) becomes EnvCrashed."""
  from py4j.protocol import Py4JError

  try:
    return fn(*args)
  except Py4JError as e:
    raise EnvCrashed(f"the ScienceWorld JVM failed during {what}: {type(e).__name__}: {str(e)[:200]}") from None


def task_variations(env, task_name: str, split: str) -> list[int]:
  """ScienceWorld's own variation split of a task (`env` loaded with that task)."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  return list(
    {"train": env.get_variations_train, "dev": env.get_variations_dev, "test": env.get_variations_test}[split]()
  )


@register_env
class ScienceWorldServerEnv(BlockingEnv):
  name = "scienceworld"
  run_in_subprocess = True
  call_timeout_s = 300.0  # loading a task builds its world in the JVM (slow on a loaded CPU)

  def __init__(self, step_limit: int = 100):
    if not isinstance(step_limit, int) or step_limit < 1:
      raise ValueError(f"scienceworld option 'step_limit' must be a positive int, got {step_limit!r}")
    self.step_limit = step_limit
    self.env = None
    self.loaded: tuple | None = None
    self.episode = False
    self.timing = {"start_s": 0.0, "load_s": 0.0, "reset_s": 0.0}

  def start_blocking(self) -> None:
    from scienceworld import ScienceWorldEnv

    t0 = time.perf_counter()
    self.env = ScienceWorldEnv("", envStepLimit=self.step_limit)
    self.timing["start_s"] = time.perf_counter() - t0
    self.task_names = list(self.env.get_task_names())

  def reset_blocking(self, row: dict | None) -> str:
    self.episode = False
    if row is None:
      return ""
    task, variation = row.get("task_name"), row.get("variation")
    simplification = row.get("simplification", "") or ""
    if task not in self.task_names:
      raise ValueError(f"scienceworld row 'task_name' {task!r} is unknown; known: {self.task_names}")
    if not isinstance(variation, int) or isinstance(variation, bool) or variation < 0:
      raise ValueError(f"scienceworld row 'variation' must be an int >= 0, got {variation!r}")
    if not isinstance(simplification, str):
      raise ValueError(f"scienceworld row 'simplification' must be a string, got {simplification!r}")
    key = (task, variation, simplification)
    t0 = time.perf_counter()
    if key != self.loaded:
      self.loaded = None
      max_variation = _call_jvm("load", self.env.get_max_variations, task)
      if variation >= max_variation:
        raise ValueError(
          f"scienceworld row 'variation' {variation} is out of range for task {task!r} (it has {max_variation})"
        )
      _call_jvm("load", self.env.load, task, variation, simplification, True)
      self.loaded = key
    t1 = time.perf_counter()
    observation, info = _call_jvm("reset", self.env.reset)
    self.timing.update(load_s=t1 - t0, reset_s=time.perf_counter() - t1)
    self.episode, self.done, self.score, self.steps = True, False, 0.0, 0
    self.task_description = info.get("taskDesc") or self.env.get_task_description()
    return f"Task: {self.task_description}\n{observation}".strip()

  def _query(self, what: str) -> StepOutcome:
    if what == "timing":
      return StepOutcome(observation="", info={"query": True, **self.timing})
    if not self.episode:
      return StepOutcome(observation="", info={"error": "NoEpisode"})
    if what == "gold_actions":
      items = _call_jvm("gold", self.env.get_gold_action_sequence)
    else:
      items = [] if self.done else _call_jvm("valid actions", self.env.get_valid_action_object_combinations)
    return StepOutcome(observation="\n".join(items), info={"query": True})

  def step_blocking(self, action: Any) -> StepOutcome:
    if isinstance(action, dict) and action.get("query") in ("valid_actions", "gold_actions", "timing"):
      return self._query(action["query"])
    if not self.episode:
      return StepOutcome(
        observation="Error: no task loaded: reset with a row naming a task", info={"error": "NoEpisode"}
      )
    if self.done:
      return StepOutcome(
        observation="The task is over; no further actions are possible.", done=True, info={"error": "EpisodeOver"}
      )
    if not isinstance(action, str) or not action.strip():
      return StepOutcome(
        observation=f"Error: an action is a non-empty command string, got {action!r:.60}", info={"error": "BadAction"}
      )
    observation, _, completed, info = _call_jvm("step", self.env.step, action.strip())
    self.steps += 1
    score = float(info.get("score", 0))
    reward = (score - self.score) / 100.0
    self.score = score
    self.done = bool(completed or score < 0 or self.steps >= self.step_limit)
    return StepOutcome(
      observation=observation,
      reward=reward,
      done=self.done,
      info={"score": score, "moves": info.get("moves"), "valid": observation != "No known action matches that input."},
    )

  def close_blocking(self) -> None:
    if self.env is not None:
      try:
        self.env.close()
      except Exception:  # noqa: BLE001 -- a dead JVM must not stop the close
        pass
    self.env = None

  @env_reward("score")
  def score_reward(self) -> dict:
    """The episode's score / 100 (1.0 = solved; negative scores count as 0) and completion."""
    if not self.episode:
      return {"reward": 0.0, "solved": 0.0, "steps": 0.0}
    return {"reward": max(0.0, self.score) / 100.0, "solved": float(self.score >= 100), "steps": float(self.steps)}
