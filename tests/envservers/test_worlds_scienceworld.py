"""The scienceworld world through a real env server (one JVM, reused across chains): gold action
sequences solve 5 tasks, a random policy scores low, bad actions, the JVM dying mid-episode."""

from __future__ import annotations

import signal

import numpy as np
import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.tasks import scienceworld as task
from envservers_helpers import child_pids, kill, running_server
from worlds_helpers import play

pytestmark = [pytest.mark.slow, pytest.mark.jvm]  # one JVM start (~10 s) + five task loads on a loaded CPU
EXPERT_TASKS = ("find-animal", "find-plant", "find-non-living-thing", "find-living-thing", "identify-life-stages-1")


@pytest.fixture(scope="module")
def sw_server():
  with running_server("scienceworld=1:1") as server:
    yield server


def _row(task_name, variation=0):
  return {"question": "science", "task_name": task_name, "variation": variation}


def test_gold_sequences_solve_five_tasks_and_random_scores_low(sw_server):
  rng = np.random.default_rng(0)

  async def expert(observation, env):
    if not getattr(env, "_plan", None):
      env._plan = (await env.step({"query": "gold_actions"})).observation.split("\n")
    return env._plan.pop(0)

  async def random_policy(observation, env):
    actions = (await env.step({"query": "valid_actions"})).observation.split("\n")
    return actions[int(rng.integers(len(actions)))]

  async def main():
    manager = EnvManager([sw_server.address])
    expert_results = [await play(manager, "scienceworld", _row(t), expert, 80, "score") for t in EXPERT_TASKS]
    random_results = [
      await play(manager, "scienceworld", _row(t), random_policy, 10, "score") for t in EXPERT_TASKS[:2]
    ]
    env = await manager.acquire("scienceworld", "timing")
    timing = (await env.step({"query": "timing"})).info
    stats = (await manager.server_stats())[sw_server.address]["pools"]["scienceworld"]
    await manager.release("scienceworld", "timing")
    await manager.aclose()
    return expert_results, random_results, timing, stats

  expert_results, random_results, timing, stats = trio.run(main)
  print(
    f"scienceworld: expert {[r['reward'] for r in expert_results]}, random "
    f"{[r['reward'] for r in random_results]}; JVM start {timing['start_s']:.1f} s, last load "
    f"{timing['load_s']:.1f} s, reset {timing['reset_s']:.2f} s"
  )
  for name, result in zip(EXPERT_TASKS, expert_results):
    assert result["reward"] == 1.0 and result["solved"] == 1.0 and result["done"], name
    assert result["step_rewards"] == pytest.approx(1.0), name
  assert np.mean([r["reward"] for r in random_results]) < 0.3
  # One JVM served every chain: a single instance, started once, never recycled.
  assert stats["live"] == 1 and stats["recycled"] == 0 and stats["crashes"] == 0
  assert timing["start_s"] > 0 and timing["reset_s"] > 0


def test_bad_actions_and_the_jvm_dying_mid_episode(sw_server):
  async def main():
    manager = EnvManager([sw_server.address])
    env = await manager.acquire("scienceworld", "crash")
    first = await env.reset(_row("find-animal"))
    assert first.startswith("Task:") and "This room is called" in first
    unknown = await env.step("fly to the moon")
    assert "No known action" in unknown.observation and unknown.info["valid"] is False
    assert not unknown.done and unknown.reward == 0.0
    bad = await env.step({"code": "x"})
    assert bad.info["error"] == "BadAction" and "command string" in bad.observation
    with pytest.raises(Exception, match="task_name"):
      await env.reset(_row("no-such-task"))
    with pytest.raises(Exception, match="variation"):
      await env.reset(_row("find-animal", 10**6))
    await env.reset(_row("find-animal"))
    plan = (await env.step({"query": "gold_actions"})).observation.split("\n")
    for action in plan:
      last = await env.step(action)
    assert last.done
    after = await env.step("look around")
    assert after.done and after.info["error"] == "EpisodeOver"
    await env.reset(_row("find-animal"))
    java = [p for p in child_pids(env.info["worker_pid"]) if b"java" in open(f"/proc/{p}/cmdline", "rb").read()]
    assert java, "the worker runs no JVM child"
    kill(java[0], signal.SIGKILL)
    crashed = await env.step("look around")
    assert crashed.info["error"] == "EnvCrashed" and "JVM" in crashed.observation
    stats = (await manager.server_stats())[sw_server.address]["pools"]["scienceworld"]
    assert stats["crashes"] == 1 and stats["recycled"] == 1
    await manager.release("scienceworld", "crash")
    await manager.aclose()

  trio.run(main)
