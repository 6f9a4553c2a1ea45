"""A group reward's step of the rollout: the chains of one row scored together once the last one ends.

    on_group = group_scorer(agent.reward_fn)        # None for a per-chain reward
    await drive_chains(rows, n, run_chain, concurrency=..., on_group=on_group)

The chains' own runners leave the reward to this step (`rollout._run_chain` skips a `Reward.group` reward).
Chains that failed (`Trajectory.error`) keep reward 0 and are not shown to the reward; a group reward that raises
fails every chain it scored, as a per-chain reward that raises fails its chain.
"""

from __future__ import annotations

import dataclasses
import logging

from agentfly_jax.agents.trajectory import last_frame

log = logging.getLogger(__name__)


def group_scorer(reward_fn):
  """`on_group` for `rollout_driver.drive_chains` when `reward_fn` is a group reward, else None."""
  if reward_fn is None or not getattr(reward_fn, "group", False):
    return None

  async def score(trajs: list) -> list:
    live = [i for i, t in enumerate(trajs) if t.error is None]
    if not live:
      return trajs
    row = trajs[live[0]].row
    try:
      results = await reward_fn.compute_group(
        [trajs[i].prediction or "" for i in live], [trajs[i].messages for i in live], row
      )
      if len(results) != len(live):
        raise ValueError(f"group reward '{reward_fn.name}' returned {len(results)} scores for {len(live)} chains")
    except Exception as e:  # the group's failure is its chains', never the rollout's
      g = trajs[live[0]].group_id
      log.warning("group reward of group %d failed", g, exc_info=True)
      error, frame = f"{type(e).__name__}: {e}", last_frame(e)
      out = list(trajs)
      for i in live:
        out[i] = dataclasses.replace(
          trajs[i], reward=0.0, reward_metrics={}, finish_reason="error", error=error, error_frame=frame
        )
      return out
    out = list(trajs)
    for i, result in zip(live, results):
      metrics = dict(result)
      out[i] = dataclasses.replace(trajs[i], reward=float(metrics.pop("reward")), reward_metrics=metrics)
    return out

  return score
