"""The rollout of a black-box agent: its own code, pointed at the OpenAI-compatible endpoint.

  async def run(client: openai.AsyncOpenAI, row: dict) -> str:    # the user's agent, unchanged
    ...  # its own loop: client.chat.completions.create(model="policy", messages=..., tools=...)
    return answer

  trajectories = run_endpoint_rollout(agent, rows, run, sampler=sampler, num_chains=4)

The alternative chain runner to `rollout.rollout`, under the same driver (`rollout_driver`), yielding
the same `Trajectory` objects: one
endpoint (`endpoint.ChatEndpoint`, served by hypercorn in this trio run on a free loopback port)
for all chains; each chain gets its own API key and its own client (with its own keep-alive
connection) and runs `agent_fn(client, row)` concurrently with the others: an asyncio agent in the
process's asyncio loop thread, a trio agent in this trio loop, a synchronous one in a thread
(agents/agent_loops.py); an outside harness is an agent_fn too (agents/harness.py). The
trajectory is built from the ids the endpoint recorded for the chain (`endpoint_records`); the
reward is the agent's `reward_fn` of the returned answer (`str(answer)`; if the agent returned
None, the last completion's text). `agent` gives the chat template, the tool-call parser and the
reward; the agent's own tools are whatever it calls (a `Tool` called with `await t.acall(...)`
keeps its limits and counters).

Finish reasons: "agent_done" (agent_fn returned), "max_turns" / "max_total_tokens" (a request
past `max_turns` requests or over the context was refused and the agent gave up: scored on the
last completion's text, like the built-in rollout), "timeout" (`chain_timeout_s`), "error" (agent_fn raised; reward 0, the
tokens it got are kept; `error_frame` says where it was raised). A chain that made no request gives no
trajectory, unless it failed: then one with no tokens, finish "error" (it trains nothing, and a run
whose chains all fail stops: rl/chain_failures.py). An agent that edits
its history gets one trajectory per token segment (`Trajectory.segment`).
"""

from __future__ import annotations

import functools
import logging
import ssl
from typing import Any, Awaitable, Callable, Sequence

import trio

from agentfly_jax.agents.agent_loops import agent_style, call_agent
from agentfly_jax.agents.endpoint import ChatEndpoint, serve_endpoint
from agentfly_jax.agents.rollout import check_chain_timeout, validate_rows
from agentfly_jax.agents.rollout_driver import check_chain_args, drive_chains
from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS, agent_view, check_reward_only
from agentfly_jax.agents.standalone_limits import STANDALONE
from agentfly_jax.agents.trajectory import Trajectory, last_frame
from agentfly_jax.sampling.protocol import SamplingParams
from agentfly_jax.tools.trio_host import TrioHost

log = logging.getLogger(__name__)
AgentFn = Callable[[Any, dict], Awaitable[Any]]


async def _run_chain(
  endpoint: ChatEndpoint,
  agent,
  agent_fn: AgentFn,
  style: str,
  row: dict,
  group_id: int,
  chain_id: int,
  ssl_context,
  base_url: str,
  chain_timeout_s: float,
  thread_limiter: trio.CapacityLimiter,
  host: TrioHost,
  reward_only_fields: Sequence[str],
) -> list[Trajectory]:
  key = endpoint.open_chain(group_id, chain_id, row)  # the record (trainer side) keeps the whole row
  answer, finish, error, frame = None, "agent_done", None, None
  if getattr(agent_fn, "sandbox", "off") != "off":  # a sandboxed harness: its key is bound to its sandbox
    agent_fn = functools.partial(agent_fn, bind=functools.partial(endpoint.bind_chain, key))
  try:
    answer, timed_out = await call_agent(
      style,
      agent_fn,
      agent_view(row, reward_only_fields),  # the agent never sees the reward's own fields
      base_url=base_url,
      api_key=key,
      ssl_context=ssl_context,
      timeout_s=chain_timeout_s,
      thread_limiter=thread_limiter,
      host=host,
    )
    if timed_out:
      finish = "timeout"
  except Exception as e:  # the agent's failure is its chain's, never the rollout's
    limit = endpoint.chains[key].limit_hit
    if limit is not None:  # refused a request over the run's limits, then gave up: scored
      finish = limit
    else:
      log.warning("endpoint chain (group %d, chain %d) failed", group_id, chain_id, exc_info=True)
      finish, error, frame = "error", f"{type(e).__name__}: {e}", last_frame(e)
  record = endpoint.close_chain(key)
  if not record.segments:
    log.warning("endpoint chain (group %d, chain %d) made no request (%s)", group_id, chain_id, error or finish)
    if error is None:
      return []
    # a failed chain stays visible (finish "error", no tokens: it trains nothing; rl/chain_failures.py)
    return [
      Trajectory(
        [], [], [], group_id=group_id, chain_id=chain_id, finish_reason="error", row=row, error=error, error_frame=frame
      )
    ]
  prediction = str(answer) if answer is not None else (record.last_text or "")
  reward, metrics = 0.0, {}
  if agent.reward_fn is not None and error is None:
    try:
      metrics = await agent.reward_fn.compute(
        prediction, record.segments[-1].messages, row, None, thread_limiter=thread_limiter
      )
      reward = float(metrics.pop("reward"))
    except Exception as e:
      log.warning("reward of endpoint chain (group %d, chain %d) failed", group_id, chain_id, exc_info=True)
      finish, error, frame, metrics = "error", f"{type(e).__name__}: {e}", last_frame(e), {}
  return record.trajectories(
    reward=reward, metrics=metrics, finish_reason=finish, prediction=prediction, error=error, error_frame=frame
  )


async def endpoint_rollout(
  agent,
  rows: Sequence[dict],
  agent_fn: AgentFn,
  *,
  sampler,
  num_chains: int = STANDALONE.num_chains,
  max_turns: int = STANDALONE.max_turns,
  sampling_params: SamplingParams | None = None,
  max_tokens_per_turn: int = STANDALONE.max_tokens_per_turn,
  max_total_tokens: int = STANDALONE.max_total_tokens,
  concurrency: int = 256,
  seed: int | None = 0,
  group_offset: int = 0,
  max_n: int = 1,
  chain_timeout_s: float = STANDALONE.chain_timeout_s,
  tool_threads: int = 128,
  model_name: str = "policy",
  gather_s: float = 0.05,
  env_provider=None,
  shared_turns: int = 0,
  max_body_bytes: int = STANDALONE.endpoint_max_body_bytes,
  reward_only_fields: Sequence[str] = REWARD_ONLY_FIELDS,
) -> list[Trajectory]:
  """Runs `agent_fn(client, row)` `num_chains` times per row, concurrently, against one endpoint
  over `sampler`; returns the trajectories row-major (a chain's segments in order), group_id =
  group_offset + row index. Arguments as `rollout.rollout`, and:

  Args:
    agent_fn: `[async] def run(client, row) -> answer` (an `openai.AsyncOpenAI`, or an `openai.OpenAI`
      for a synchronous function).
    max_turns: requests per chain (more get an error reply).
    max_n: most choices (`n`) per request.
    chain_timeout_s: wall-clock seconds per chain (> 0): past it the agent is cancelled (an outside harness's
      process tree killed) and the chain ends with finish "timeout".
    model_name: the model id the agent must ask for.
    max_body_bytes: the endpoint's largest request body (413 beyond it).
    reward_only_fields: row fields the agent's `row` (a harness's AGENTFLY_ROW / stdin) never holds; the
      reward gets the whole row (data/row_fields.py).
    gather_s: how long the endpoint may hold a request for the other chains' requests of the
      turn (one sampler batch instead of many small ones; `ChatEndpoint`).
    env_provider: accepted as `rollout.rollout` takes it (the trainer passes its own); a black-box
      agent's tools are its own and env-bound rewards are refused up front, so it is not used.
  """
  del env_provider
  check_chain_args(
    "endpoint_rollout", num_chains=num_chains, max_turns=max_turns, concurrency=concurrency, tool_threads=tool_threads
  )
  if not callable(agent_fn):
    raise TypeError(f"endpoint_rollout: agent_fn must be a function (client, row), got {type(agent_fn).__name__}")
  style = agent_style(agent_fn)
  if agent.reward_fn is not None and agent.reward_fn.env_name:
    raise ValueError(
      f"endpoint_rollout: reward {agent.reward_fn.name!r} is bound to environment "
      f"{agent.reward_fn.env_name!r}; a black-box agent's chains hold no environment"
    )
  if agent.reward_fn is not None and agent.reward_fn.group:
    raise ValueError(
      f"endpoint_rollout: reward {agent.reward_fn.name!r} scores a row's chains together (a group reward); "
      "a black-box agent's chains are scored one by one: use a per-chain reward (judge.mode='chain')"
    )
  check_chain_timeout("endpoint_rollout", chain_timeout_s)
  reward_only_fields = check_reward_only(reward_only_fields, "endpoint_rollout: reward_only_fields")
  validate_rows(agent, rows, reward_only_fields)
  endpoint = ChatEndpoint(
    agent,
    sampler,
    model_name=model_name,
    sampling_params=sampling_params,
    max_tokens_per_turn=max_tokens_per_turn,
    max_total_tokens=max_total_tokens,
    max_turns=max_turns,
    max_n=max_n,
    seed=seed,
    fixed_temperature=True,
    gather_s=gather_s,
    shared_turns=shared_turns,
    max_body_bytes=max_body_bytes,
  )
  thread_limiter = trio.CapacityLimiter(tool_threads)
  ssl_context = ssl.create_default_context()  # built once: the chains' clients share it
  async with serve_endpoint(endpoint) as base_url:
    async with trio.open_nursery() as nursery:
      host = TrioHost(nursery)  # asyncio agents' Tool.acall calls run here (tools/trio_host.py)

      async def run_chain(row, group_id, chain_id):
        return await _run_chain(
          endpoint,
          agent,
          agent_fn,
          style,
          row,
          group_id,
          chain_id,
          ssl_context,
          base_url,
          chain_timeout_s,
          thread_limiter,
          host,
          reward_only_fields,
        )

      results = await drive_chains(
        rows, num_chains, run_chain, concurrency=concurrency, group_offset=group_offset, on_group=None
      )  # (no group rewards here: refused above)
  return [t for chain_trajs in results for t in chain_trajs]


def run_endpoint_rollout(agent, rows: Sequence[dict], agent_fn: AgentFn, **kwargs) -> list[Trajectory]:
  """Synchronous `endpoint_rollout` (runs its own trio loop); same arguments."""
  return trio.run(functools.partial(endpoint_rollout, agent, rows, agent_fn, **kwargs))
