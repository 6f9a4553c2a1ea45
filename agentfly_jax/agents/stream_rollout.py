"""A continuous rollout: groups of chains start while others still run, each finished group handed on
at once (partial rollouts, rl/partial_rollout.py). The chains are the built-in rollout's
(`rollout._run_chain`: same token-in/token-out record, finish reasons, rewards, env handling).

    await stream_groups(agent, next_group, on_group, may_start, stopped, sampler=..., num_chains=4, ...)

`next_group() -> (row, group_id)` gives the next row (group ids are global and seed the requests);
`on_group(group_id, trajectories)` receives a group's `num_chains` trajectories when its last chain
ends; a new group starts only while `may_start()`; when `stopped()` the chains still running are
cancelled (their environments released) and the call returns. Synchronous callbacks, run on the
trio thread.
"""

from __future__ import annotations

import functools
import uuid
from typing import Callable

import trio

from agentfly_jax.agents.rollout import _Config, _run_chain, validate_rows
from agentfly_jax.sampling.protocol import SamplingParams
from agentfly_jax.tools.tool import get_env_provider

POLL_S = 0.002  # how often a waiting stream re-checks may_start / stopped


async def stream_groups(
  agent,
  next_group: Callable[[], tuple[dict, int]],
  on_group: Callable[[int, list], None],
  may_start: Callable[[], bool],
  stopped: Callable[[], bool],
  *,
  sampler,
  num_chains: int,
  max_turns: int,
  sampling_params: SamplingParams,
  max_tokens_per_turn: int,
  max_total_tokens: int,
  concurrency: int = 256,
  env_provider=None,
  seed: int | None = 0,
  tool_threads: int = 128,
) -> None:
  """Runs groups until `stopped()` (see the module docstring)."""

  def provider_getter():
    return get_env_provider(env_provider, getattr(agent, "env_provider", None))

  cfg = _Config(
    sampler=sampler,
    max_turns=max_turns,
    sampling_params=sampling_params,
    max_tokens_per_turn=max_tokens_per_turn,
    max_total_tokens=max_total_tokens,
    seed=seed,
    provider_getter=functools.lru_cache(maxsize=1)(provider_getter),
    run_id=uuid.uuid4().hex[:10],
    thread_limiter=trio.CapacityLimiter(tool_threads),
  )
  limiter = trio.CapacityLimiter(concurrency)

  async def group(row, group_id):
    results: list = [None] * num_chains

    async def chain(c):
      async with limiter:
        results[c] = await _run_chain(agent, row, group_id, c, cfg)

    async with trio.open_nursery() as nursery:
      for c in range(num_chains):
        nursery.start_soon(chain, c)
    on_group(group_id, results)

  async with trio.open_nursery() as nursery:
    while not stopped():
      if not may_start():
        await trio.sleep(POLL_S)
        continue
      row, group_id = next_group()
      validate_rows(agent, [row])
      nursery.start_soon(group, row, group_id)
      await trio.sleep(0)
    nursery.cancel_scope.cancel()
