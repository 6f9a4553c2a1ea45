"""`textworld`: TextWorld games (generated and cached by `textworld_games`), one per episode.

A row names its game by `game_file` (a path) or by {"game_seed", "game_kind", "difficulty"}.
`reset` returns the objective and the opening text (without the ASCII-art title); a step is one command; the step reward is
the score change / the game's max score (a won game sums to 1.0); done when won or lost. Each
instance runs in a worker process of its own (TextWorld drives a Z-machine interpreter in C): a
crash there costs only that instance, which the pool recycles. Query actions (not game moves):
{"query": "admissible_commands"} and {"query": "walkthrough"} (the expert's commands).

Options (`--env-opt textworld.NAME=VALUE`): cache_dir (games folder), max_steps (default 100).
"""

from __future__ import annotations

import os
import re
from typing import Any

from envservers.env import BlockingEnv, StepOutcome, env_reward
from envservers.envs.textworld_games import game_file
from envservers.registry import register_env


def resolve_game(row: dict, cache_dir: str | None) -> str:
  """The game file a row names; ValueError naming the bad field."""
  if row.get("game_file") is not None:
    path = row["game_file"]
    if not isinstance(path, str) or not os.path.isfile(path):
      raise ValueError(f"textworld row 'game_file' {path!r} is not a file")
    return path
  missing = [k for k in ("game_seed", "game_kind", "difficulty") if k not in row]
  if missing:
    raise ValueError(f"textworld row needs 'game_file' or game_seed/game_kind/difficulty; missing {missing}")
  return game_file(row["game_kind"], row["difficulty"], row["game_seed"], cache_dir)


def strip_banner(text: str) -> str:
  """The opening text without TextWorld's ASCII-art title (its leading lines without letters)."""
  lines = text.strip("\n").split("\n")
  while lines and not re.search(r"[A-Za-z]", lines[0]):
    lines.pop(0)
  return "\n".join(lines).strip()


@register_env
class TextWorldEnv(BlockingEnv):
  name = "textworld"
  run_in_subprocess = True
  call_timeout_s = 120.0  # a reset may generate a missing game first

  def __init__(self, cache_dir: str = "", max_steps: int = 100):
    if not isinstance(max_steps, int) or max_steps < 1:
      raise ValueError(f"textworld option 'max_steps' must be a positive int, got {max_steps!r}")
    self.cache_dir = cache_dir or None
    self.max_steps = max_steps
    self.env = None
    self.path: str | None = None
    self.state = None

  def start_blocking(self) -> None:
    import textworld  # noqa: F401  (fail at start, not mid-episode, if it is missing)

  def reset_blocking(self, row: dict | None) -> str:
    self.state = None
    if row is None:
      return ""
    import textworld

    path = self.game_path(row)
    if path != self.path:
      self.close_blocking()
      self.env = textworld.start(path, request_infos=self.request_infos())
      self.path = path
    self.state = self.env.reset()
    self.steps, self.score, self.done = 0, 0, False
    self.walkthrough = self.expert_commands(self.state)
    return strip_banner(self.state.feedback)

  def game_path(self, row: dict) -> str:
    """The game file of a row (subclasses: other layouts)."""
    return resolve_game(row, self.cache_dir)

  def request_infos(self):
    import textworld

    return textworld.EnvInfos(
      admissible_commands=True, max_score=True, score=True, policy_commands=True, objective=True, won=True, lost=True
    )

  def expert_commands(self, state) -> list[str]:
    """The walkthrough of the game just reset."""
    return list(state.policy_commands or [])

  def step_blocking(self, action: Any) -> StepOutcome:
    if isinstance(action, dict) and action.get("query") in ("admissible_commands", "walkthrough"):
      if self.state is None:
        return StepOutcome(observation="", info={"error": "NoEpisode"})
      items = (
        self.walkthrough
        if action["query"] == "walkthrough"
        else []
        if self.done
        else list(self.state.admissible_commands or [])
      )
      return StepOutcome(observation="\n".join(items), info={"query": True})
    if self.state is None:
      return StepOutcome(
        observation="Error: no game loaded: reset with a row naming a game", info={"error": "NoEpisode"}
      )
    if self.done:
      return StepOutcome(
        observation="The game is over; no further commands are possible.", done=True, info={"error": "EpisodeOver"}
      )
    if not isinstance(action, str) or not action.strip():
      return StepOutcome(
        observation=f"Error: a command is a non-empty string, got {action!r:.60}", info={"error": "BadAction"}
      )
    self.state, score, done = self.env.step(action.strip())
    self.steps += 1
    max_score = max(1, self.state.max_score or 1)
    reward = (score - self.score) / max_score
    self.score = score
    self.done = bool(done or self.state.won or self.state.lost or self.steps >= self.max_steps)
    return StepOutcome(
      observation=self.state.feedback.strip(),
      reward=reward,
      done=self.done,
      info={"score": score, "max_score": max_score, "won": bool(self.state.won), "lost": bool(self.state.lost)},
    )

  def close_blocking(self) -> None:
    if self.env is not None:
      try:
        self.env.close()
      except Exception:  # noqa: BLE001 -- closing a broken game must not raise
        pass
    self.env, self.path = None, None

  @env_reward("score")
  def score_reward(self) -> dict:
    """The episode's score / max score, and whether the game was won."""
    if self.state is None:
      return {"reward": 0.0, "won": 0.0}
    max_score = max(1, self.state.max_score or 1)
    return {"reward": self.score / max_score, "won": float(bool(self.state.won)), "steps": float(self.steps)}
