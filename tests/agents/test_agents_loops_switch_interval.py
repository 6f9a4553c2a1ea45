"""The GIL switch interval that the asyncio agents' loop thread lowers (agents/agent_loops.py): lowered
while at least one chain runs there, counted over concurrent chains (the first one in lowers it, the
last one out restores it), restored when a chain fails, never raised, and someone else's setting made
meanwhile is left as they set it. (The real shared loop thread; trio on the test's side.)"""

import asyncio
import sys
import threading

import pytest
import trio

from agentfly_jax.agents import agent_loops
from agentfly_jax.agents.agent_loops import SWITCH_INTERVAL, AsyncioAgentLoop

LOW = 0.0005


@pytest.fixture(autouse=True)
def interval(monkeypatch):
  """The interpreter's default interval before each test, the test's low one configured; both back after."""
  before = sys.getswitchinterval()
  sys.setswitchinterval(0.005)
  monkeypatch.setattr(agent_loops, "SWITCH_INTERVAL_S", LOW)
  yield
  sys.setswitchinterval(before)


async def _chain(name: str, go: threading.Event, seen: dict, fail: bool = False):
  """In the asyncio loop: notes the interval at its start, waits for `go`, notes it again."""
  seen[name + "_start"] = sys.getswitchinterval()
  while not go.is_set():
    await asyncio.sleep(0.001)
  seen[name + "_end"] = sys.getswitchinterval()
  if fail:
    raise RuntimeError(f"{name} failed")
  return name


async def _wait_for(predicate):
  with trio.fail_after(10):
    while not predicate():
      await trio.sleep(0.001)


def test_lowered_while_concurrent_chains_run_and_restored_by_the_last_one():
  loop, seen, done = AsyncioAgentLoop.shared(), {}, []
  go = {"a": threading.Event(), "b": threading.Event()}

  async def run(name):
    done.append(await loop.run(_chain, name, go[name], seen))

  async def main():
    async with trio.open_nursery() as nursery:
      nursery.start_soon(run, "a")
      await _wait_for(lambda: "a_start" in seen)
      nursery.start_soon(run, "b")
      await _wait_for(lambda: "b_start" in seen)
      assert SWITCH_INTERVAL.holders == 2
      go["a"].set()
      await _wait_for(lambda: done == ["a"])
      assert sys.getswitchinterval() == pytest.approx(LOW)  # b still runs: not restored yet
      go["b"].set()
    assert done == ["a", "b"]
    assert SWITCH_INTERVAL.holders == 0
    assert sys.getswitchinterval() == pytest.approx(0.005)  # the last one out restored it

  trio.run(main)
  assert seen == {k: pytest.approx(LOW) for k in ("a_start", "b_start", "a_end", "b_end")}


def test_restored_after_a_failing_chain_and_after_a_cancelled_one():
  loop, seen = AsyncioAgentLoop.shared(), {}
  go = threading.Event()
  go.set()

  async def failing():
    with pytest.raises(RuntimeError, match="a failed"):
      await loop.run(_chain, "a", go, seen, True)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    with trio.move_on_after(0.05):  # b never gets `go`: cancelled from trio
      await loop.run(_chain, "b", threading.Event(), seen)
    assert sys.getswitchinterval() == pytest.approx(0.005)

  trio.run(failing)
  assert (seen["a_start"], seen["b_start"]) == (pytest.approx(LOW), pytest.approx(LOW))
  assert SWITCH_INTERVAL.holders == 0


@pytest.mark.parametrize("setting, inside", [(0.0, 0.005), (0.01, 0.005)])
def test_switched_off_or_higher_setting_leaves_the_interval_alone(monkeypatch, setting, inside):
  monkeypatch.setattr(agent_loops, "SWITCH_INTERVAL_S", setting)  # 0 = off; 10 ms would raise it: never
  seen, go = {}, threading.Event()
  go.set()
  assert trio.run(AsyncioAgentLoop.shared().run, _chain, "a", go, seen) == "a"
  assert seen["a_start"] == pytest.approx(inside)
  assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_setting_made_by_someone_else_meanwhile_is_kept():
  seen, go = {}, threading.Event()

  async def main():
    async with trio.open_nursery() as nursery:
      nursery.start_soon(AsyncioAgentLoop.shared().run, _chain, "a", go, seen)
      await _wait_for(lambda: "a_start" in seen)
      sys.setswitchinterval(0.002)  # the user's own, while the chain runs
      go.set()
    assert sys.getswitchinterval() == pytest.approx(0.002)

  trio.run(main)
  assert seen["a_start"] == pytest.approx(LOW)
