"""The one rollout driver (agents/rollout_driver.py): the built-in rollout and the endpoint rollout are two
chain runners under it: the same argument check (same message, naming the argument), the same
group / chain ids (group_offset + row index, 0 .. num_chains - 1), row-major results, one chain limit."""

import importlib

import pytest
import trio

from agentfly_jax.agents import load_tokenizer
from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
from agentfly_jax.agents.rollout import run_rollout
from agentfly_jax.agents.rollout_driver import check_chain_args, drive_chains
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import lookup
from agentfly_jax.tasks.lookup_agent import run as openai_lookup_agent

from endpoint_testlib import WARMSTART, lookup_script


@pytest.fixture(scope="module")
def agent():
  return lookup.make_agent(load_tokenizer(WARMSTART))


def _sampler(agent):
  return ScriptedSampler(lookup_script(agent.tokenizer))


def _both(agent, rows, **kwargs):
  """(built-in trajectories, endpoint trajectories) of the same rows and arguments."""
  builtin = run_rollout(agent, rows, sampler=_sampler(agent), **kwargs)
  served = run_endpoint_rollout(agent, rows, openai_lookup_agent, sampler=_sampler(agent), **kwargs)
  return builtin, served


@pytest.mark.parametrize("name", ["num_chains", "max_turns", "concurrency", "tool_threads"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_the_same_bad_argument_gets_the_same_error_from_both_runners(agent, name, bad):
  rows = lookup.make_rows(1, seed=0)
  expected = f"{name} must be an int >= 1, got {bad!r}"
  with pytest.raises(ValueError) as builtin:
    run_rollout(agent, rows, sampler=_sampler(agent), **{name: bad})
  with pytest.raises(ValueError) as served:
    run_endpoint_rollout(agent, rows, openai_lookup_agent, sampler=_sampler(agent), **{name: bad})
  assert str(builtin.value) == f"rollout: {expected}"
  assert str(served.value) == f"endpoint_rollout: {expected}"
  with pytest.raises(ValueError, match=f"^driver: {expected}$"):
    check_chain_args("driver", **{"num_chains": 1, "max_turns": 1, "concurrency": 1, "tool_threads": 1, name: bad})


def test_both_runners_go_through_the_driver_and_number_groups_and_chains_alike(agent, monkeypatch):
  calls = []

  async def spy(rows, num_chains, run_chain, **kwargs):
    calls.append((len(rows), num_chains, kwargs))
    return await drive_chains(rows, num_chains, run_chain, **kwargs)

  for module in ("rollout", "endpoint_rollout"):  # the modules (the package exports functions of these names)
    monkeypatch.setattr(importlib.import_module(f"agentfly_jax.agents.{module}"), "drive_chains", spy)
  rows = lookup.make_rows(3, seed=1)
  builtin, served = _both(agent, rows, num_chains=2, group_offset=7, concurrency=3)
  assert calls == [(3, 2, {"concurrency": 3, "group_offset": 7, "on_group": None})] * 2  # per-chain rewards
  ids = [(g, c) for g in (7, 8, 9) for c in (0, 1)]
  assert [(t.group_id, t.chain_id) for t in builtin] == ids
  assert [(t.group_id, t.chain_id) for t in served] == ids
  assert [t.row for t in builtin] == [t.row for t in served] == [r for r in rows for _ in range(2)]


def test_drive_chains_is_row_major_and_holds_the_chain_limit():
  running, most = 0, 0

  async def run_chain(row, group_id, chain_id):
    nonlocal running, most
    running += 1
    most = max(most, running)
    await trio.sleep(0.001 * (3 - chain_id))  # later chains finish first
    running -= 1
    return (row["question"], group_id, chain_id)

  rows = [{"question": "a"}, {"question": "b"}]
  results = trio.run(lambda: drive_chains(rows, 3, run_chain, concurrency=2, group_offset=4))
  assert results == [("a", 4, 0), ("a", 4, 1), ("a", 4, 2), ("b", 5, 0), ("b", 5, 1), ("b", 5, 2)]
  assert most == 2

  async def two_calls_one_limiter():  # a limiter shared across calls (stream_rollout: one per run)
    limiter = trio.CapacityLimiter(1)
    async with trio.open_nursery() as nursery:
      for g in range(2):
        nursery.start_soon(lambda g=g: drive_chains(rows[g : g + 1], 2, run_chain, concurrency=limiter, group_offset=g))

  running, most = 0, 0
  trio.run(two_calls_one_limiter)
  assert most == 1
