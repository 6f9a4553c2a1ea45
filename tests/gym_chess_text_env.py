"""A text game from PyPI for the `gymnasium` env type's tests: gym-bullet-chess's registered
Gymnasium env (BulletChess-v0, chess against its random opponent) with the package's own
language-agent parts: `UCIActionWrapper` (a Text action: a UCI move such as "e2e4") and
`format_position_for_llm` (the position as text: FEN, turn, clocks, legal UCI moves) as the
observation. Registered as "tests.gym_chess_text_env:UCIChess-v0"."""

from __future__ import annotations

import gymnasium
from gym_bullet_chess import UCIActionWrapper, format_position_for_llm
from gymnasium import spaces


class PositionText(gymnasium.Wrapper):
  """Observations as the package's text rendering of the position (taken from `info`)."""

  def __init__(self, env):
    super().__init__(env)
    self.observation_space = spaces.Text(max_length=8192, charset=[chr(c) for c in range(32, 127)] + ["\n"])

  def reset(self, **kwargs):
    _, info = self.env.reset(**kwargs)
    return format_position_for_llm(info), info

  def step(self, action):
    _, reward, terminated, truncated, info = self.env.step(action)
    return format_position_for_llm(info), reward, terminated, truncated, info


def make_uci_chess(**kwargs):
  return PositionText(UCIActionWrapper(gymnasium.make("BulletChess-v0", opponent="random", **kwargs).unwrapped))


gymnasium.register(id="UCIChess-v0", entry_point=make_uci_chess, disable_env_checker=True)
