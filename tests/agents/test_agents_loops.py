"""Agents as they exist in the wild, through the endpoint (agents/agent_loops.py, agents/harness.py):
asyncio agents (gather, wait_for, sleep, Semaphore, an awaited Tool), trio agents and synchronous
agents give the built-in agent's trajectories token for token; an outside harness process (its own
client, configured by OPENAI_BASE_URL / OPENAI_API_KEY) too; `max_tokens` over the run's limit is
clamped, not refused; a chain that fails before any request stays visible with its error and frame.
(Real hypercorn server on loopback, real openai / httpx clients, real subprocesses; scripted sampler.)"""

import asyncio
import json
import os
import sys

import numpy as np
import pytest
import trio

import agentfly_jax
from agentfly_jax.agents import load_tokenizer, run_rollout
from agentfly_jax.agents.agent_loops import agent_style
from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
from agentfly_jax.rl.batching import rollout_metrics
from agentfly_jax.rl.chain_failures import ChainFailureGuard, ChainsFailedError
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import Task, lookup
from agentfly_jax.tasks.lookup import SYSTEM_PROMPT
from agentfly_jax.tasks.lookup import lookup as lookup_tool
from agentfly_jax.tasks.lookup_agent import LOOKUP_SCHEMA

from endpoint_testlib import WARMSTART, assert_segment_is_sampler_output, lookup_script
from envservers_helpers import sandbox_unavailable_reason

HARNESS = os.path.join(os.path.dirname(__file__), "harness_lookup_agent.py")
SANDBOX = "bwrap" if sandbox_unavailable_reason() is None else "off"  # harnesses in bubblewrap where it runs


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(WARMSTART)


@pytest.fixture(scope="module")
def agent(tok):
  return lookup.make_agent(tok)


def _first_messages(row):
  return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]


async def asyncio_agent(client, row):  # asyncio primitives everywhere; the Tool awaited from asyncio
  gate = asyncio.Semaphore(1)
  messages = _first_messages(row)
  for _ in range(4):
    async with gate:
      await asyncio.sleep(0.001)
      reply = await asyncio.wait_for(
        client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP_SCHEMA]), timeout=60
      )
    message = reply.choices[0].message
    if not message.tool_calls:
      return message.content
    messages.append(message.model_dump(exclude_none=True))
    keys = [json.loads(c.function.arguments)["key"] for c in message.tool_calls]
    results = await asyncio.gather(*(lookup_tool.acall(key=k) for k in keys))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": r} for c, r in zip(message.tool_calls, results)]


async def trio_agent(client, row):  # trio primitives: runs in the rollout's trio loop
  messages = _first_messages(row)
  for _ in range(4):
    await trio.sleep(0.001)
    message = (
      (await client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP_SCHEMA]))
      .choices[0]
      .message
    )
    if not message.tool_calls:
      return message.content
    messages.append(message.model_dump(exclude_none=True))
    for c in message.tool_calls:
      result = await lookup_tool.acall(key=json.loads(c.function.arguments)["key"])
      messages.append({"role": "tool", "tool_call_id": c.id, "content": result})


def sync_agent(client, row):  # the synchronous openai.OpenAI client, in a worker thread
  messages = _first_messages(row)
  for _ in range(4):
    message = (
      client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP_SCHEMA]).choices[0].message
    )
    if not message.tool_calls:
      return message.content
    messages.append(message.model_dump(exclude_none=True))
    for c in message.tool_calls:
      result = lookup_tool(key=json.loads(c.function.arguments)["key"])  # a Tool called outside trio
      messages.append({"role": "tool", "tool_call_id": c.id, "content": result})


@pytest.mark.parametrize(
  "agent_fn, style",
  [(asyncio_agent, "asyncio"), (trio_agent, "trio"), (sync_agent, "sync"), ("harness", "trio")],
)
def test_every_agent_style_gives_the_builtin_agents_trajectories(tok, agent, agent_fn, style):
  rows, chains = lookup.make_rows(3, seed=5), 2
  if agent_fn == "harness":  # one process per chain (~3 s of imports each): one chain
    # sandboxed: the repository (its agentfly_jax, which the harness imports) shown read-only, PYTHONPATH passed on
    repo = os.path.dirname(os.path.dirname(agentfly_jax.__file__))
    task = Task(
      reward=lookup.code_match,
      rows=rows,
      agent_cmd=[sys.executable, HARNESS],
      agent_mounts=[repo],
      agent_env=["PYTHONPATH"],
      agent_sandbox=SANDBOX,
    )
    agent_fn = task.agent_fn
    rows, chains = rows[:1], 1
  assert agent_style(agent_fn) == style
  builtin = run_rollout(agent, rows, sampler=ScriptedSampler(lookup_script(tok)), num_chains=chains)
  sampler = ScriptedSampler(lookup_script(tok))
  served = run_endpoint_rollout(agent, rows, agent_fn, sampler=sampler, num_chains=chains, chain_timeout_s=60)
  assert len(served) == len(builtin) == len(rows) * chains
  for a, b in zip(builtin, served):
    assert b.finish_reason == "agent_done", b.error
    assert b.token_ids.tolist() == a.token_ids.tolist()
    np.testing.assert_array_equal(b.action_mask, a.action_mask)
    assert (b.group_id, b.chain_id, b.num_turns, b.reward) == (a.group_id, a.chain_id, 2, 1.0)
    assert_segment_is_sampler_output(b, sampler.calls)


async def _asyncio_timeout_agent(client, row):
  await client.chat.completions.create(model="policy", messages=_first_messages(row))
  await asyncio.sleep(30)


def test_asyncio_chain_timeout_keeps_its_tokens(tok, agent):
  [t] = run_endpoint_rollout(
    agent,
    lookup.make_rows(1, 0),
    _asyncio_timeout_agent,
    sampler=ScriptedSampler(lookup_script(tok)),
    chain_timeout_s=0.5,
  )
  assert (t.finish_reason, t.num_turns, t.error) == ("timeout", 1, None)


async def _too_greedy_agent(client, row):  # asks for more tokens than the run allows per turn
  reply = await client.chat.completions.create(model="policy", messages=_first_messages(row), max_tokens=10_000)
  return reply.choices[0].finish_reason


def test_max_tokens_over_the_limit_is_clamped_and_counted(tok, agent):
  sampler = ScriptedSampler(lambda prompt: tok.encode("word " * 40))  # longer than 8 tokens, no end of turn
  [t] = run_endpoint_rollout(agent, lookup.make_rows(1, 0), _too_greedy_agent, sampler=sampler, max_tokens_per_turn=8)
  assert (t.finish_reason, t.prediction, t.clamped_requests) == ("agent_done", "length", 1)
  assert int(t.action_mask.sum()) == 8
  assert rollout_metrics([t])["rollout/clamped_max_tokens"] == 1


async def _broken_before_any_request(client, row):
  raise RuntimeError("no running event loop (as an asyncio agent inside trio said)")


def test_a_chain_failing_before_any_request_is_visible_and_stops_the_run(tok, agent):
  rows = lookup.make_rows(2, 0)
  trajs = run_endpoint_rollout(agent, rows, _broken_before_any_request, sampler=ScriptedSampler(lookup_script(tok)))
  assert [(t.finish_reason, len(t.token_ids)) for t in trajs] == [("error", 0)] * 2
  line = _broken_before_any_request.__code__.co_firstlineno + 1
  assert trajs[0].error_frame == f"test_agents_loops.py:{line} in _broken_before_any_request"
  with pytest.raises(ChainsFailedError, match=r"step 1: every chain failed \(2 of 2.*RuntimeError: no running.*\n  at"):
    ChainFailureGuard().check(1, trajs)


def test_a_harness_that_exits_before_any_request_names_its_command(tok, agent):
  task = Task(
    reward=lookup.code_match,
    rows=lookup.make_rows(1, 0),
    agent_cmd=[sys.executable, HARNESS, "--fail"],
    agent_sandbox=SANDBOX,
  )
  [t] = run_endpoint_rollout(agent, lookup.make_rows(1, 0), task.agent_fn, sampler=ScriptedSampler(lookup_script(tok)))
  assert t.finish_reason == "error" and "exited with status 3; stderr: harness: no config here" in t.error
  with pytest.raises(ValueError, match="Task.agent_cmd=.*program 'no-such-harness-xyz' not found"):
    Task(reward=lookup.code_match, rows=lookup.make_rows(1, 0), agent_cmd="no-such-harness-xyz --go")


def test_bad_agent_loop_override_is_named():
  async def run(client, row):
    return ""

  run.agent_loop = "gevent"
  with pytest.raises(ValueError, match="Task.agent_fn: agent 'run': agent_loop must be 'trio' or 'asyncio'"):
    Task(reward=lookup.code_match, rows=lookup.make_rows(1, 0), agent_fn=run)


def test_config_task_agent_cmd_is_checked_and_becomes_the_agent(tmp_path):
  from agentfly_jax.rl.config import default_config
  from agentfly_jax.tasks.from_config import build_task, set_custom_task

  def build(**fields):
    return build_task(set_custom_task(default_config(), module="agentfly_jax.tasks.lookup", **fields))

  with pytest.raises(ValueError, match="config.task.agent_cmd='no-such-harness-xyz': program 'no-such-harness-xyz'"):
    build(agent_cmd="no-such-harness-xyz")
  with pytest.raises(ValueError, match="config.task.agent_cmd=.* and config.task.agent=.*: give one agent"):
    build(agent_cmd=f"{sys.executable} {HARNESS}", agent="agentfly_jax.tasks.lookup_agent:run")
  assert build(agent_cmd=f"{sys.executable} {HARNESS}").agent_fn.command == [sys.executable, HARNESS]
