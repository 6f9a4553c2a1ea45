"""The textworld world: seeded generated games, walkthrough expert and random policy through a
real env server, bad commands, and a worker crash mid-episode."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.tasks import textworld as task
from envservers.envs.textworld_games import game_file
from envservers_helpers import kill, running_server
from worlds_helpers import play

GAMES = [
  ("treasure_hunter", "easy", 11),
  ("coin_collector", "easy", 12),
  ("cooking", "easy", 13),
  ("treasure_hunter", "medium", 14),
]


@pytest.fixture(scope="module")
def games(tmp_path_factory):
  cache = str(tmp_path_factory.mktemp("textworld_games"))
  first = game_file(*GAMES[0], cache_dir=cache)  # one generated here, the rest by the server
  return cache, first


@pytest.fixture(scope="module")
def tw_server(games):
  cache, _ = games
  with running_server("textworld=2:1", options=(f"textworld.cache_dir={cache}",)) as server:
    yield server


def _rows(games):
  cache, first = games
  rows = [{"question": "play", "game_file": first}]
  rows += [{"question": "play", "game_kind": k, "game_seed": s, "difficulty": d} for k, d, s in GAMES[1:]]
  return rows


def test_games_are_seeded_and_cached(games, tmp_path):
  cache, first = games
  assert os.path.basename(first) == "treasure_hunter-easy-11.z8"
  mtime = os.path.getmtime(first)
  assert game_file(*GAMES[0], cache_dir=cache) == first and os.path.getmtime(first) == mtime
  with pytest.raises(ValueError, match="game_kind"):
    game_file("maze", "easy", 1, cache_dir=cache)
  with pytest.raises(ValueError, match="difficulty"):
    game_file("cooking", "insane", 1, cache_dir=cache)
  rows = task.make_rows_split(6, 0, "test")
  assert rows == task.make_rows_split(6, 0, "test")
  assert all(r["game_seed"] % 2 == 1 for r in rows)
  assert all(r["game_seed"] % 2 == 0 for r in task.make_rows_split(6, 0, "train"))


@pytest.mark.slow
def test_walkthrough_solves_every_game_random_scores_low(games, tw_server):
  rng = np.random.default_rng(0)

  async def expert(observation, env):
    if not getattr(env, "_plan", None):
      env._plan = (await env.step({"query": "walkthrough"})).observation.split("\n")
    return env._plan.pop(0)

  async def random_policy(observation, env):
    commands = (await env.step({"query": "admissible_commands"})).observation.split("\n")
    return commands[int(rng.integers(len(commands)))]

  async def main():
    manager = EnvManager([tw_server.address])
    expert_results, random_results = [], []
    for row in _rows(games):
      expert_results.append(await play(manager, "textworld", row, expert, 60, "score"))
      random_results.append(await play(manager, "textworld", row, random_policy, 20, "score"))
    stats = await manager.server_stats()
    await manager.aclose()
    return expert_results, random_results, stats

  expert_results, random_results, stats = trio.run(main)
  expert_rewards = [r["reward"] for r in expert_results]
  random_rewards = [r["reward"] for r in random_results]
  print(f"textworld: expert {expert_rewards}, random {random_rewards} (mean {np.mean(random_rewards):.3f})")
  assert expert_rewards == [1.0] * len(GAMES)
  assert all(r["won"] == 1.0 and r["done"] for r in expert_results)
  assert all(r["step_rewards"] == pytest.approx(1.0) for r in expert_results)
  assert np.mean(random_rewards) < 0.5
  pool = next(iter(stats.values()))["pools"]["textworld"]
  assert pool["crashes"] == 0 and pool["live"] <= 2


def test_bad_commands_and_a_crash_mid_episode(games, tw_server):
  cache, first = games

  async def main():
    manager = EnvManager([tw_server.address])
    env = await manager.acquire("textworld", "crash-chain")
    opening = await env.reset({"question": "play", "game_file": first})
    assert opening
    unknown = await env.step("fly to the moon")
    assert unknown.observation and not unknown.done and unknown.reward == 0.0
    empty = await env.step("   ")
    assert "non-empty string" in empty.observation and empty.info["error"] == "BadAction"
    plan = (await env.step({"query": "walkthrough"})).observation.split("\n")
    for command in plan:
      last = await env.step(command)
    assert last.done and last.info["won"]
    after = await env.step("look")
    assert after.done and "over" in after.observation and after.info["error"] == "EpisodeOver"
    assert (await env.step({"query": "admissible_commands"})).observation == ""
    # A fresh episode on the same instance, then its worker dies mid-episode.
    await env.reset({"question": "play", "game_file": first})
    kill(env.info["worker_pid"], signal.SIGKILL)
    crashed = await env.step("look")
    assert crashed.info["error"] == "EnvCrashed" and "died" in crashed.observation
    stats = (await manager.server_stats())[tw_server.address]["pools"]["textworld"]
    assert stats["crashes"] >= 1 and stats["recycled"] >= 1
    # The chain goes on with a fresh instance (its state is gone: reset it).
    assert await env.reset({"question": "play", "game_file": first})
    assert (await env.step("look")).observation
    with pytest.raises(Exception, match="game_file"):
      await env.reset({"question": "play", "game_file": "/nonexistent.z8"})
    await manager.release("textworld", "crash-chain")
    await manager.aclose()

  trio.run(main)
