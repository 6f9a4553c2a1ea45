"""One rollout stream for every mode: each step's finished chains from a producer under a staleness policy.

    stream = open_stream(run, loop, start)     # rollout.mode / max_staleness / partial choose the policy
    got = stream.get(step, loop)               # StreamBatch: trajectories + their metrics + the step's marks
    sync_metrics = stream.publish(step, params)
    stream.close()

The loop (rl/loop.rl_step) knows only this interface. The policies:
  - staleness 0 (rollout.mode = "sync"): the step's chains are rolled out in the trainer's thread with the
    weights of the last update, and `publish` loads the new weights at once (`InlineStream`);
  - bounded staleness (mode "async"): a producer thread rolls out step batches with the newest version at
    most `max_staleness` updates old (rl/async_rollout.RolloutProducer);
  - partial (mode "async", partial): chains span policy versions and groups carry over steps, every
    token within the bound by scheduling, none masked (rl/partial_rollout.PartialRolloutProducer).
The counters a step reports (tool calls, env acquires, the sampler's work) are differences of snapshots:
around the rollout for the inline stream, since the last step for the producers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from agentfly_jax.envs.pool_metrics import env_usage_mark
from agentfly_jax.rl import partial_rollout, stages
from agentfly_jax.tools.limits import tool_counts


@dataclasses.dataclass
class StreamBatch:
  """A step's trajectories, their rollout metrics, and where the step's counters start (env acquires: None
  when a producer's rollouts overlap steps; tool counts)."""

  trajectories: list
  metrics: dict
  env_mark: Any
  tools_before: dict


def rollout_step(run, position: int, step: int) -> list:
  """The trajectories of step `step`, whose rows start at data position `position`."""
  from agentfly_jax.rl.run import rollout, rows_at

  rows = rows_at(run, position, run.spec.rollout.rows_per_step)
  return rollout(run, rows, seed=run.spec.seed * 1_000_003 + step)


class InlineStream:
  """Staleness 0: each step's chains rolled out in the caller's thread, on the weights of the last update."""

  def __init__(self, run, loop):
    self.run = run
    run.weights.load(loop.state.params)

  def get(self, step: int, loop) -> StreamBatch:
    p = self.run.parts
    env_mark = env_usage_mark(p.env_provider)  # the step reports only its own acquires ...
    tools_before = tool_counts(p.agent.tools.values())  # ... and its own tool calls (not the last eval's)
    mark = stages.sampler_mark(p.sampler)
    trajs = rollout_step(self.run, loop.data_position, step)
    metrics = stages.sampler_metrics(p.sampler, mark)  # sampler/prefix_*, slot_occupancy, ...
    stages.release_prefix_cache(p.sampler)  # stale after this step's update; frees memory for it
    return StreamBatch(trajs, metrics, env_mark, tools_before)

  def publish(self, step: int, params) -> dict:
    return stages.sync(self.run.weights, params)

  def idle_metrics(self, step_metrics: dict, wall_s: float) -> dict:
    return {}

  def close(self) -> None:
    pass


class ProducerStream:
  """Bounded staleness or partial rollouts: step batches from a producer thread (async_rollout /
  partial_rollout), the trainer's waits and the producer's idle time reported per step."""

  def __init__(self, run, producer):
    self.run, self.producer = run, producer
    self._trainer_wait = 0.0

  def get(self, step: int, loop) -> StreamBatch:
    from agentfly_jax.rl.async_rollout import staleness_metrics

    batch = self.producer.get(step)
    metrics = partial_rollout.batch_metrics(self.producer, batch, step, self.run.spec, staleness_metrics)
    metrics.update(stages.engine_metrics(self.run.parts.sampler))  # the engine's work since the last step
    return StreamBatch(batch.trajectories, metrics, None, loop.tools_seen)  # the producer's calls since then

  def publish(self, step: int, params) -> dict:
    self.producer.publish(step, params)
    return {}

  def idle_metrics(self, step_metrics: dict, wall_s: float) -> dict:
    """async/trainer_idle_frac (the trainer's wait for batches over the loop's wall time so far, `wall_s`)
    and async/sampler_idle_frac (the producer's idle over its idle + busy time)."""
    self._trainer_wait += step_metrics["time/rollout_s"]
    idle, busy = self.producer.idle_s, self.producer.busy_s
    return {
      "async/trainer_idle_frac": self._trainer_wait / max(1e-9, wall_s),
      "async/sampler_idle_frac": idle / max(1e-9, idle + busy),
    }

  def close(self) -> None:
    self.producer.close()


def open_stream(run, loop, start: int):
  """The stream of `run`'s steps after `start`, rows from the loop's data position, the sampler loaded with
  the loop's params."""
  spec = run.spec
  if not spec.asynchronous:
    return InlineStream(run, loop)
  if spec.rollout.partial:  # chains span policy versions; groups carry over steps
    return ProducerStream(run, partial_rollout.start_producer(run, loop, start))
  from agentfly_jax.rl.async_rollout import RolloutProducer

  run.weights.load(jax.tree.map(jnp.copy, loop.state.params))  # a copy: the train step donates the params
  pos0 = loop.data_position
  producer = RolloutProducer(
    lambda s: rollout_step(run, pos0 + (s - start - 1) * spec.rollout.rows_per_step, s),
    run.weights,
    first_step=start + 1,
    last_step=spec.train.steps,
    max_staleness=spec.rollout.max_staleness,
    start_version=start,
  ).start()
  return ProducerStream(run, producer)
