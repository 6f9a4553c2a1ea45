"""Helpers for the interactive-world tests: play episodes through a real env server."""

from __future__ import annotations

import itertools

from agentfly_jax.envs.manager import EnvManager

_chain_ids = itertools.count()


async def play(manager: EnvManager, env_name: str, row: dict, policy, max_steps: int, reward_name: str) -> dict:
  """One episode: reset with `row`, then `policy(observation, env) -> action` (awaitable) until
  done or `max_steps`; returns {reward (env reward), step_rewards (sum), steps, done, reward
  metrics}."""
  chain = f"test-{env_name}-{next(_chain_ids)}"
  env = await manager.acquire(env_name, chain)
  try:
    observation = await env.reset(row)
    total, steps, done = 0.0, 0, False
    while steps < max_steps and not done:
      action = await policy(observation, env)
      result = await env.step(action)
      observation, done = result.observation, result.done
      total += result.reward or 0.0
      steps += 1
    metrics = await env.compute_reward(reward_name)
    return {**metrics, "step_rewards": total, "steps": steps, "done": done, "last_observation": observation}
  finally:
    await manager.release(env_name, chain)
