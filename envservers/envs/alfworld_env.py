"""`alfworld`: ALFWorld's TextWorld games (PDDL, `game.tw-pddl`) from the user's ALFWorld data.

ALFWorld's games come only from its download (`alfworld-download`), so this env needs the data
folder: option `data_dir` or $ALFWORLD_DATA, laid out as ALFWorld's
  $ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen}/<task>/<trial>/game.tw-pddl
A row names its game by `game_file` (absolute, or relative to the data folder); `list_games`
lists a split. Reward: 1.0 when the goal is reached (ALFWorld's `won`), as score change; the
`admissible_commands` query gives ALFWorld's valid actions, `walkthrough` the game's expert
commands (its "walkthrough" field). Needs TextWorld's PDDL backend (`fast-downward-textworld`).
"""

from __future__ import annotations

import glob
import os

from envservers.envs.textworld_env import TextWorldEnv
from envservers.registry import register_env

SPLITS = ("train", "valid_seen", "valid_unseen")


def data_folder(data_dir: str = "") -> str:
  """The ALFWorld data folder; ValueError naming what is missing."""
  folder = data_dir or os.environ.get("ALFWORLD_DATA", "")
  if not folder:
    raise ValueError(
      "alfworld needs ALFWorld's data folder: set ALFWORLD_DATA (or the option "
      "alfworld.data_dir) to the folder `alfworld-download` fills; it is not set"
    )
  if not os.path.isdir(os.path.join(folder, "json_2.1.1")):
    raise ValueError(
      f"alfworld data folder {folder!r} has no 'json_2.1.1' folder (ALFWorld's "
      f"layout: json_2.1.1/<split>/<task>/<trial>/game.tw-pddl); set ALFWORLD_DATA "
      f"to the folder `alfworld-download` fills"
    )
  return folder


def list_games(data_dir: str, split: str) -> list[str]:
  """The game files of one split, relative to the data folder, sorted."""
  if split not in SPLITS:
    raise ValueError(f"alfworld split must be one of {SPLITS}, got {split!r}")
  folder = data_folder(data_dir)
  pattern = os.path.join(folder, "json_2.1.1", split, "*", "*", "game.tw-pddl")
  return sorted(os.path.relpath(p, folder) for p in glob.glob(pattern))


@register_env
class AlfWorldEnv(TextWorldEnv):
  name = "alfworld"

  def __init__(self, data_dir: str = "", max_steps: int = 50):
    super().__init__(max_steps=max_steps)
    self.data_dir = data_folder(data_dir)  # fails at server start, naming the folder

  def start_blocking(self) -> None:
    import fast_downward  # noqa: F401  (TextWorld's PDDL backend)

  def game_path(self, row: dict) -> str:
    path = row.get("game_file")
    if not isinstance(path, str) or not path:
      raise ValueError(f"alfworld row needs 'game_file' (a game.tw-pddl path), got {path!r}")
    full = path if os.path.isabs(path) else os.path.join(self.data_dir, path)
    if not os.path.isfile(full):
      raise ValueError(f"alfworld row 'game_file' {path!r} is not a file under {self.data_dir!r}")
    return full

  def request_infos(self):
    import textworld

    return textworld.EnvInfos(
      admissible_commands=True, won=True, lost=True, score=True, max_score=True, extras=["walkthrough"]
    )

  def expert_commands(self, state) -> list[str]:
    return list(state.get("extra.walkthrough") or [])
