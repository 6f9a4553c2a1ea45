"""The `gymnasium` env type through a real env server: a text env defined in the tests
(tests/gym_text_env.py) and a registered env of the gymnasium package itself (CliffWalking, with
the integer codec); a bad id, seed or action is an error naming it and the server serves on."""

from __future__ import annotations

import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from envservers.envs.gym_env import GymnasiumEnv
from envservers_helpers import running_server, server_stats

TEXT_ID = "tests.gym_text_env:WordGuess-v0"


@pytest.fixture(scope="module")
def gym_server():
  with running_server("gymnasium=2", options=(f"gymnasium.gym_id={TEXT_ID}",)) as server:
    yield server


def test_text_env_and_package_env_through_the_server(gym_server):
  async def main():
    manager = EnvManager([gym_server.address])
    env = await manager.acquire("gymnasium", "chain-1")
    opening = await env.reset({"seed": 3})  # the server's default id: the text env
    words = opening.split("one of: ")[1].rstrip(".").split(", ")
    results = []
    for word in words:
      result = await env.step(word)
      results.append(result)
      if result.done:
        break
    assert results[-1].reward == 1.0 and results[-1].observation == "Right!"
    assert all(r.reward == 0.0 and "letters in the right place" in r.observation for r in results[:-1])
    ret = await env.compute_reward("return")
    assert ret["reward"] == 1.0 and ret["steps"] == len(results)
    # A registered env of the gymnasium package, integer observations / actions as text.
    assert await env.reset({"gym_id": "CliffWalking-v1", "seed": 0}) == "36"
    steps = [await env.step(a) for a in ["0"] + ["1"] * 11 + ["2"]]
    assert [s.observation for s in steps[:3]] == ["24", "25", "26"] and steps[-1].observation == "47"
    assert steps[-1].done and not any(s.done for s in steps[:-1])
    assert (await env.compute_reward("return"))["reward"] == -13.0
    await manager.release("gymnasium", "chain-1")
    await manager.aclose()

  trio.run(main)


def test_bad_ids_and_actions_are_named_and_the_server_serves_on(gym_server):
  async def main():
    manager = EnvManager([gym_server.address])
    env = await manager.acquire("gymnasium", "chain-2")
    for row, named in (
      ({"gym_id": "NoSuchGame-v0"}, "NoSuchGame-v0"),
      ({"gym_id": "no_such_module:Game-v0"}, "no_such_module"),
      ({"gym_id": "CliffWalking-v1", "seed": "x"}, "seed"),
    ):
      with pytest.raises(Exception, match=named):
        await env.reset(row)
    assert await env.reset({"gym_id": "CliffWalking-v1", "seed": 0}) == "36"
    bad = await env.step("north")
    assert bad.info["error"] == "BadAction" and "integer in [0, 3]" in bad.observation and not bad.done
    out = await env.step("7")
    assert out.info["error"] == "BadAction" and "not in the action space" in out.observation
    assert (await env.step("0")).observation == "24"  # the episode goes on
    await manager.release("gymnasium", "chain-2")
    stats = (await server_stats(gym_server.address))["pools"]["gymnasium"]
    await manager.aclose()
    return stats

  stats = trio.run(main)
  assert stats["crashes"] == 0


def test_released_instances_are_reused_and_each_chain_resets_with_its_row():
  """A server with no default gym id: chains that name theirs in the row reuse one released
  instance (same instance, same worker process: no new env process per chain); a chain whose first
  call on a used instance is no reset gets the pool's reset without a row, which fails for this
  env: counted and named, not silent."""

  async def main(server):
    manager = EnvManager([server.address])
    seen = []
    for chain in ("a", "b", "c"):
      env = await manager.acquire("gymnasium", chain)
      seen.append((env.info["instance_id"], env.info["worker_pid"]))
      assert await env.reset({"gym_id": "CliffWalking-v1", "seed": 0}) == "36"
      assert (await env.step("0")).observation == "24"
      await manager.release("gymnasium", chain)
    env = await manager.acquire("gymnasium", "no-reset")
    with pytest.raises(Exception, match="reset"):
      await env.compute_reward("return")
    await manager.release("gymnasium", "no-reset")
    stats = (await server_stats(server.address))["pools"]["gymnasium"]
    await manager.aclose()
    return seen, stats

  with running_server("gymnasium=1:1") as server:
    seen, stats = trio.run(main, server)
  assert len(set(seen)) == 1, seen
  assert stats["reset_failures"] == 1 and stats["recycled"] == 1 and stats["crashes"] == 0


def test_options_are_checked_when_the_server_starts():
  with pytest.raises(ValueError, match="max_steps"):
    GymnasiumEnv(max_steps=0)
  with pytest.raises(ValueError, match="gym_id"):
    GymnasiumEnv(gym_id=3)
