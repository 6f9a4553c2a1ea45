"""TextWorld games generated offline by the project, seeded and cached on disk.

A game is named by (kind, difficulty, seed): kinds `treasure_hunter`, `coin_collector`,
`cooking`, `simple`; difficulties `easy`, `medium`, `hard` (TextWorld's challenge settings below).
`game_file(kind, difficulty, seed)` returns the path of the compiled game (`.z8`), generating it
first if the cache lacks it (~5-10 s; a seed whose map has no room for the quest moves on to
seeds derived from it, deterministically). The cache folder is `cache_dir`, else
$AGENTFLY_TEXTWORLD_CACHE, else ~/.cache/agentfly_jax/textworld.
"""

from __future__ import annotations

import os
import shutil
import tempfile

GAME_KINDS = ("treasure_hunter", "coin_collector", "cooking", "simple")
DIFFICULTIES = ("easy", "medium", "hard")
_ATTEMPTS = 20

_SETTINGS = {
  "treasure_hunter": {"easy": {"level": 5}, "medium": {"level": 15}, "hard": {"level": 25}},
  "coin_collector": {"easy": {"level": 5}, "medium": {"level": 15}, "hard": {"level": 30}},
  "cooking": {
    "easy": {"recipe": 1, "take": 1, "go": 6, "open": True, "cook": False, "cut": False},
    "medium": {"recipe": 2, "take": 2, "go": 6, "open": True, "cook": True, "cut": False},
    "hard": {"recipe": 3, "take": 3, "go": 9, "open": True, "cook": True, "cut": True},
  },
  "simple": {
    "easy": {"rewards": "dense", "goal": "detailed"},
    "medium": {"rewards": "balanced", "goal": "detailed"},
    "hard": {"rewards": "sparse", "goal": "brief"},
  },
}


def cache_folder(cache_dir: str | None = None) -> str:
  return (
    cache_dir
    or os.environ.get("AGENTFLY_TEXTWORLD_CACHE")
    or os.path.join(os.path.expanduser("~"), ".cache", "agentfly_jax", "textworld")
  )


def check_game_spec(kind: str, difficulty: str, seed) -> None:
  """ValueError naming the bad field of a (kind, difficulty, seed) game spec."""
  if kind not in GAME_KINDS:
    raise ValueError(f"textworld 'game_kind' {kind!r} is unknown; known: {list(GAME_KINDS)}")
  if difficulty not in DIFFICULTIES:
    raise ValueError(f"textworld 'difficulty' {difficulty!r} is unknown; known: {list(DIFFICULTIES)}")
  if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
    raise ValueError(f"textworld 'game_seed' must be an int in [0, 2**31), got {seed!r}")


def game_file(kind: str, difficulty: str, seed: int, cache_dir: str | None = None) -> str:
  """The compiled game for (kind, difficulty, seed), generated into the cache if missing."""
  check_game_spec(kind, difficulty, seed)
  folder = cache_folder(cache_dir)
  path = os.path.join(folder, f"{kind}-{difficulty}-{seed}.z8")
  if os.path.exists(path):
    return path
  import textworld
  import textworld.challenges
  from textworld.generator import compile_game
  from textworld.generator.chaining import QuestGenerationError

  os.makedirs(folder, exist_ok=True)
  settings = dict(_SETTINGS[kind][difficulty])
  if kind == "cooking":
    settings.update(drop=False, recipe_seed=seed, split=None)
  make = textworld.challenges.CHALLENGES[f"tw-{kind}"][1]
  with tempfile.TemporaryDirectory(dir=folder) as scratch:  # concurrent makers never collide
    options = textworld.GameOptions()
    options.path = os.path.join(scratch, os.path.basename(path))
    options.force_recompile = True
    for attempt in range(_ATTEMPTS):
      # Some seeds give maps without room for the quest: derive the next seed deterministically.
      options.seeds = seed if attempt == 0 else (seed * 1_000_003 + attempt * 7_919) % 2**31
      try:
        game = make(settings, options)
        break
      except QuestGenerationError as e:
        error = e
    else:
      raise RuntimeError(
        f"textworld could not generate a {kind}/{difficulty} game from seed {seed} in {_ATTEMPTS} attempts: {error}"
      )
    compiled = compile_game(game, options)
    json_path = os.path.splitext(compiled)[0] + ".json"
    if os.path.exists(json_path):
      shutil.move(json_path, os.path.splitext(path)[0] + ".json")
    os.replace(compiled, path)  # atomic: readers see a whole game or none
  return path
