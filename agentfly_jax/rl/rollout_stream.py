"""One rollout stream for every mode: each step's finished chains from one producer under a staleness policy.

    stream = open_stream(run, loop, start)     # rollout.mode / max_staleness / partial choose the policy
    got = stream.get(step, loop)               # StreamBatch: trajectories + their metrics + the step's marks
    sync_metrics = stream.publish(step, params)
    stream.close()

The loop (rl/loop.rl_step) knows only this interface; every mode is one rl/partial_rollout.RolloutProducer
(versions, admission, earliest-deadline consumption, the staleness check on every batch) with a source:
  - staleness 0 (rollout.mode = "sync"): whole step batches, no thread: each step's chains are rolled out in
    the trainer's thread on the weights of the last update, and `publish` loads the new weights at once;
  - bounded staleness (mode "async"): whole step batches from the producer's thread, each on the newest
    version at most `max_staleness` updates old;
  - partial (mode "async", partial): one continuous stream of groups; chains span policy versions and
    groups carry over steps, every token within the bound by scheduling, none masked.
The counters a step reports (tool calls, env acquires, the sampler's work) are differences of snapshots:
around the rollout for the sync stream, since the last step for the threaded ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from agentfly_jax.envs.pool_metrics import env_usage_mark
from agentfly_jax.rl import partial_rollout, stages
from agentfly_jax.rl.partial_rollout import BatchSource, RolloutProducer
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
  """Staleness 0 (sync): the producer without a thread, each step's batch rolled out in the caller's thread by
  `get` on the weights `publish` loaded; the step's sampler, env and tool counters taken around it."""

  def __init__(self, run, producer: RolloutProducer):
    self.run, self.producer = run, producer

  def get(self, step: int, loop) -> StreamBatch:
    p = self.run.parts
    env_mark = env_usage_mark(p.env_provider)  # the step reports only its own acquires ...
    tools_before = tool_counts(p.agent.tools.values())  # ... and its own tool calls (not the last eval's)
    mark = stages.sampler_mark(p.sampler)
    trajs = self.producer.get(step).trajectories
    metrics = stages.sampler_metrics(p.sampler, mark)  # sampler/prefix_*, slot_occupancy, ...
    stages.release_prefix_cache(p.sampler)  # stale after this step's update; frees memory for it
    return StreamBatch(trajs, metrics, env_mark, tools_before)

  def publish(self, step: int, params) -> dict:
    metrics = stages.sync(self.run.weights, params)  # loaded now: the next batch's request finds them
    self.producer.publish(step, params, copy=False)
    return metrics

  def idle_metrics(self, step_metrics: dict, wall_s: float) -> dict:
    return {}

  def close(self) -> None:
    self.producer.close()


class ProducerStream:
  """Bounded staleness or partial rollouts: step batches from the producer's thread, the trainer's waits and
  the producer's idle time reported per step."""

  def __init__(self, run, producer: RolloutProducer):
    self.run, self.producer = run, producer
    self._trainer_wait = 0.0

  def get(self, step: int, loop) -> StreamBatch:
    batch = self.producer.get(step)
    metrics = partial_rollout.producer_metrics(self.producer, batch, step)
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
  spec, r = run.spec, run.spec.rollout
  inline = not spec.asynchronous
  pos0 = loop.data_position
  if r.partial:  # chains span policy versions; groups carry over steps
    source = partial_rollout.stream_source(run, pos0, start)
  else:  # whole step batches, the step's seeds
    source = BatchSource(lambda s: rollout_step(run, pos0 + (s - start - 1) * r.rows_per_step, s), start + 1)
  # a thread's copy: the train step donates the params
  run.weights.load(loop.state.params if inline else jax.tree.map(jnp.copy, loop.state.params))
  producer = RolloutProducer(
    source,
    run.weights,
    rows_per_step=r.rows_per_step,
    max_staleness=0 if inline else r.max_staleness,
    start_version=start,
    total_groups=(spec.train.steps - start) * r.rows_per_step,
    inline=inline,
    drain=None if r.partial else True,  # a whole batch holds one version
  ).start()
  return InlineStream(run, producer) if inline else ProducerStream(run, producer)
