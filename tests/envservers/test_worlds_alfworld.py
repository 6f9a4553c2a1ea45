"""The alfworld adapter: a clear error without ALFWorld's data, and a tiny game in ALFWorld's
layout (a PDDL domain/problem/grammar written for this test, tests/data/alfworld_tiny) played
through a real env server when TextWorld's PDDL backend (fast-downward-textworld) is installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from envservers.envs.alfworld_env import AlfWorldEnv, list_games
from envservers_helpers import running_server
from worlds_helpers import play
from train_cli import TESTS_DIR

TINY = os.path.join(TESTS_DIR, "data", "alfworld_tiny")
WALKTHROUGH = ["go to table", "take apple from table", "go to shelf", "put apple in/on shelf"]


def test_missing_data_folder_gives_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.delenv("ALFWORLD_DATA", raising=False)
  with pytest.raises(ValueError, match="set ALFWORLD_DATA"):
    AlfWorldEnv()
  with pytest.raises(ValueError, match=f"{tmp_path}.*has no 'json_2.1.1'"):
    AlfWorldEnv(data_dir=str(tmp_path))
  # The server refuses to start, naming the folder.
  env = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
  env["ALFWORLD_DATA"] = str(tmp_path / "nowhere")
  out = subprocess.run(
    [sys.executable, "-m", "envservers", "--port", "0", "--env", "alfworld=1"],
    capture_output=True,
    text=True,
    timeout=120,
    env=env,
  )
  assert out.returncode != 0 and "nowhere" in out.stderr and "json_2.1.1" in out.stderr


def _build_data_folder(root) -> str:
  """ALFWorld's layout with one tiny game per split."""
  game = {
    name: open(os.path.join(TINY, file)).read()
    for name, file in (("pddl_domain", "domain.pddl"), ("pddl_problem", "problem.pddl"), ("grammar", "grammar.twl2"))
  }
  game.update(walkthrough=WALKTHROUGH, solvable=True)
  for split in ("train", "valid_seen"):
    trial = root / "json_2.1.1" / split / "pick_and_place_simple-Apple-None-Shelf-1" / "trial_0"
    trial.mkdir(parents=True)
    (trial / "game.tw-pddl").write_text(json.dumps(game))
    (trial / "traj_data.json").write_text(json.dumps({"task_type": "pick_and_place_simple"}))
  return str(root)


@pytest.mark.skipif(
  importlib.util.find_spec("fast_downward") is None,
  reason="TextWorld's PDDL backend (fast-downward-textworld) is not installed",
)
def test_tiny_game_in_alfworld_layout_through_a_server(tmp_path):
  data = _build_data_folder(tmp_path)
  games = list_games(data, "valid_seen")
  assert games == ["json_2.1.1/valid_seen/pick_and_place_simple-Apple-None-Shelf-1/trial_0/game.tw-pddl"]
  with running_server("alfworld=1:1", options=(f"alfworld.data_dir={data}",)) as server:

    async def expert(observation, env):
      if not getattr(env, "_plan", None):
        env._plan = (await env.step({"query": "walkthrough"})).observation.split("\n")
      return env._plan.pop(0)

    async def main():
      manager = EnvManager([server.address])
      won = await play(manager, "alfworld", {"game_file": games[0]}, expert, 10, "score")
      env = await manager.acquire("alfworld", "probe")
      first = await env.reset({"game_file": games[0]})
      valid = (await env.step({"query": "admissible_commands"})).observation.split("\n")
      nothing = await env.step("fly away")
      await manager.release("alfworld", "probe")
      await manager.aclose()
      return won, first, valid, nothing

    won, first, valid, nothing = trio.run(main)
  assert won["reward"] == 1.0 and won["won"] == 1.0 and won["done"] and won["steps"] == 4
  assert "tiny house" in first and "go to table" in valid and "go to shelf" in valid
  assert not nothing.done and nothing.reward == 0.0
