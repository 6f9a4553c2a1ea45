"""A continuous rollout: groups of chains start while others still run, each finished group handed on
at once (partial rollouts, rl/partial_rollout.py). The chains are the built-in rollout's
(`rollout._run_chain`: same token-in/token-out record, finish reasons, rewards, env handling), each
group's started by the one driver (`rollout_driver.drive_chains`, one chain limiter for all groups).

    await stream_groups(agent, next_group, on_group, may_start, stopped, sampler=..., num_chains=4, ...)

`next_group() -> (row, group_id)` gives the next row (group ids are global and seed the requests);
`on_group(group_id, trajectories)` receives a group's `num_chains` trajectories when its last chain
ends; a new group starts only while `may_start()`; when `stopped()` the chains still running are
cancelled (their environments released) and the call returns. Synchronous callbacks, run on the
trio thread.
"""

from __future__ import annotations

from typing import Callable, Sequence

import trio

from agentfly_jax.agents.group_rewards import group_scorer
from agentfly_jax.agents.rollout import _run_chain, check_shared_turns, make_config, validate_rows
from agentfly_jax.agents.rollout_driver import drive_chains
from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS
from agentfly_jax.agents.standalone_limits import STANDALONE
from agentfly_jax.sampling.protocol import SamplingParams

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
  shared_turns: int = 0,
  tool_threads: int = 128,
  chain_timeout_s: float = STANDALONE.chain_timeout_s,
  reward_only_fields: Sequence[str] = REWARD_ONLY_FIELDS,
) -> None:
  """Runs groups until `stopped()` (see the module docstring). `seed` / `shared_turns`: as `rollout.run_rollout`'s
  (a group's request seeds from its global id; its chains share their first `shared_turns` turns' seeds)."""
  check_shared_turns("stream_groups", shared_turns, seed)
  cfg = make_config(
    agent,
    sampler=sampler,
    max_turns=max_turns,
    sampling_params=sampling_params,
    max_tokens_per_turn=max_tokens_per_turn,
    max_total_tokens=max_total_tokens,
    env_provider=env_provider,
    seed=seed,
    shared_turns=shared_turns,
    tool_threads=tool_threads,
    chain_timeout_s=chain_timeout_s,
    reward_only_fields=reward_only_fields,
  )
  limiter = trio.CapacityLimiter(concurrency)  # shared by all groups' chains
  score_group = group_scorer(agent.reward_fn)  # a group reward: each group scored when its last chain ends

  async def run_chain(row, group_id, chain_id):
    return await _run_chain(agent, row, group_id, chain_id, cfg)

  async def group(row, group_id):
    trajs = await drive_chains(
      [row], num_chains, run_chain, concurrency=limiter, group_offset=group_id, on_group=score_group
    )
    on_group(group_id, trajs)

  async with trio.open_nursery() as nursery:
    while not stopped():
      if not may_start():
        await trio.sleep(POLL_S)
        continue
      row, group_id = next_group()
      validate_rows(agent, [row], cfg.reward_only_fields)
      nursery.start_soon(group, row, group_id)
      await trio.sleep(0)
    nursery.cancel_scope.cancel()
