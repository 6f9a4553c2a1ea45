"""Partial rollouts (config.rollout.mode="async", rollout.partial=True): chains span policy versions.

    producer = PartialRolloutProducer(run_stream, weights, rows_per_step=R, max_staleness=k, ...).start()
    batch = producer.get(step)            # StepBatch: the first R groups to finish, in finishing order
    producer.publish(step, params)        # loaded at the next turn boundary, not the next batch

Unlike rl/async_rollout.py (a step's batch rolled out whole under one version, so the slowest chain
holds the step), one continuous rollout (agents/stream_rollout.py) keeps up to
(max_staleness + 1) * R groups started and not yet consumed (max_staleness 0: the sync loop); a step takes the first R groups that
finished, and a long group carries over into a later step. A group starts only when the newest
version is recent enough for the step that will (in finishing order) take it. New weights are loaded between sampler
requests (`VersionGate`: new requests wait while the in-flight ones drain, then the load), so a chain
cut by an update resumes its next turn with the new weights; the JAX sampler re-prefills the context
(its prefix cache is cleared on a load), vLLM too (it resets its prefix cache on a load).

Versions: every turn records the version that sampled it (`Trajectory.policy_versions`, one per turn:
the sampler result's `policy_version`); its log-probs are that version's, so decoupled PPO's
behaviour term is per token. Staleness per token segment: a request is sampled only with a version v
such that (the next step to consume - 1) - v <= max_staleness; a turn that is older than that when its
group is finally consumed at step s ((s - 1) - v > max_staleness) is left out of the loss
(`mask_stale_segments`: its tokens stay as context; the Trajectory keeps its action mask).
On a resume the stream restarts at the checkpoint's data position (R rows per step done); chains in
flight at the save are not kept.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from agentfly_jax.agents.busy_clock import BusyClock
from agentfly_jax.rl.async_rollout import StepBatch
from agentfly_jax.rl.turn_rewards import turn_spans


class VersionGate:
  """The weights a continuous rollout samples with: `await request()` before each sampler call
  (loads a newer published version once no request is in flight; waits while the loaded version
  is too stale for the next step to consume), `done()` after it. Trio side (one thread)."""

  def __init__(self, weights, max_staleness: int, start_version: int, poll_s: float = 0.002):
    self.weights, self.max_staleness, self.poll_s = weights, max_staleness, poll_s
    self.lock = threading.Lock()
    self.published: tuple[int, object] = (start_version, None)  # set by the trainer thread
    self.next_step = start_version + 1  # the step whose batch the trainer takes next
    self.loaded = start_version
    self.in_flight = 0
    self.loads = 0
    self.clock = BusyClock("partial-sampler")  # busy while >= 1 request is in flight

  async def request(self) -> int:
    import trio

    while True:
      with self.lock:
        version, params = self.published
        next_step = self.next_step
      if version > self.loaded:  # drain, then load (new requests wait here meanwhile)
        if self.in_flight == 0 and self.weights.lock.acquire(blocking=False):
          try:
            if params is not None:
              self.weights.load(params)
          finally:
            self.weights.lock.release()
          self.loaded, self.loads = version, self.loads + 1
          continue
      elif (next_step - 1) - self.loaded <= self.max_staleness and self.weights.lock.acquire(blocking=False):
        self.in_flight += 1  # the sampler's lock is held while requests are in flight (an eval waits)
        self.clock.__enter__()
        return self.loaded
      await trio.sleep(self.poll_s)

  def done(self) -> None:
    self.in_flight -= 1
    self.clock.__exit__()
    self.weights.lock.release()


class VersionedSampler:
  """`sampler` behind a `VersionGate`: each result carries `policy_version`, the version that wrote it."""

  def __init__(self, sampler, gate: VersionGate):
    self.sampler, self.gate = sampler, gate

  def __getattr__(self, name):
    return getattr(self.sampler, name)

  async def agenerate(self, prompt, params):
    version = await self.gate.request()
    try:
      result = await self.sampler.agenerate(prompt, params)
    finally:
      self.gate.done()
    result.policy_version = version
    return result


class PartialRolloutProducer:
  """The producer thread of partial rollouts; the interface of async_rollout.RolloutProducer
  (start / get / publish / close, busy_s / idle_s). `run_stream(sampler, next_group, on_group,
  may_start, stopped)` runs agents/stream_rollout.stream_groups with the run's settings (trio.run
  in this thread); `row_at(k)` is the k-th row of the stream."""

  def __init__(
    self,
    run_stream: Callable,
    row_at: Callable[[int], dict],
    weights,
    *,
    rows_per_step: int,
    max_staleness: int,
    start_version: int,
  ):
    if max_staleness < 0:
      raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    self._run_stream, self._row_at, self._weights = run_stream, row_at, weights
    self.rows_per_step, self.max_staleness = rows_per_step, max_staleness
    self.capacity = (max_staleness + 1) * rows_per_step  # groups started and not yet consumed
    self.gate = VersionGate(weights, max_staleness, start_version)
    self._cond = threading.Condition()
    self._ready: collections.deque = collections.deque()  # finished groups: (group_id, trajectories)
    self._started = self._consumed = 0
    self._error: BaseException | None = None
    self._stop = False
    self._t0 = time.perf_counter()
    self._thread = threading.Thread(target=self._run, name="partial-rollout-producer", daemon=True)

  @property
  def busy_s(self) -> float:
    return self.gate.clock.busy_s()

  @property
  def idle_s(self) -> float:
    return max(0.0, time.perf_counter() - self._t0 - self.busy_s)

  def start(self) -> "PartialRolloutProducer":
    self._t0 = time.perf_counter()
    self._thread.start()
    return self

  def publish(self, version: int, params) -> None:
    """Update `version` is done; the rollout loads a copy at its next turn boundary."""
    copy = jax.tree.map(jnp.copy, params)
    with self.gate.lock:
      self.gate.published = (version, copy)

  def get(self, step: int) -> StepBatch:
    """The first `rows_per_step` groups to finish (group ids renumbered 0..R-1 in finishing order)."""
    t0 = time.perf_counter()
    with self._cond:
      self._cond.wait_for(lambda: self._error is not None or len(self._ready) >= self.rows_per_step)
      if self._error is not None:
        raise RuntimeError("the partial rollout failed") from self._error
      groups = [self._ready.popleft() for _ in range(self.rows_per_step)]
      self._consumed += self.rows_per_step
    with self.gate.lock:
      self.gate.next_step = step + 1
    trajs = [dataclasses.replace(t, group_id=i) for i, (_, group) in enumerate(groups) for t in group]
    versions = [v for t in trajs for v in t.policy_versions]
    oldest = min(versions) if versions else step - 1
    return StepBatch(step, trajs, oldest, 0.0, time.perf_counter() - t0)

  def close(self) -> None:
    with self._cond:
      self._stop = True
      self._cond.notify_all()
    self._thread.join(timeout=600)

  # ---------------------------------------------------------------- the producer thread
  def _next_group(self):
    with self._cond:
      k = self._started
      self._started += 1
    return self._row_at(k), k

  def _on_group(self, group_id, trajs) -> None:
    with self._cond:
      self._ready.append((group_id, trajs))
      self._cond.notify_all()

  def _may_start(self) -> bool:
    """Room for a group, and the newest version recent enough for the step that will take it
    (FIFO: `ahead // R` steps after the next one)."""
    with self._cond:
      ahead = self._started - self._consumed
    if ahead >= self.capacity:
      return False
    with self.gate.lock:
      version, next_step = self.gate.published[0], self.gate.next_step
    return (next_step - 1 + ahead // self.rows_per_step) - version <= self.max_staleness

  def _run(self):
    try:
      self._run_stream(
        VersionedSampler(self._weights.sampler, self.gate),
        self._next_group,
        self._on_group,
        self._may_start,
        lambda: self._stop,
      )
    except BaseException as e:  # noqa: BLE001 - handed to the trainer thread
      with self._cond:
        self._error = e
        self._cond.notify_all()


def staleness_metrics(batch: StepBatch, step: int, max_staleness: int, weight_loads: int) -> dict:
  """async/* metrics of a partial batch: staleness of its oldest turn, the share of turns per
  staleness (those past the bound: async/staleness_hist/over, masked out of the loss), the share of
  chains that span several versions, the producer's weight loads so far (`weight_loads`)."""
  versions = [v for t in batch.trajectories for v in t.policy_versions]
  stale = [step - 1 - v for v in versions]
  out = {
    "async/staleness": float(max(stale, default=0)),
    "async/policy_version": float(batch.version),
    "async/sampler_wait_s": batch.waited_s,
    "async/weight_loads": float(weight_loads),
    "async/chains_spanning_versions": float(
      np.mean([len(set(t.policy_versions)) > 1 for t in batch.trajectories]) if batch.trajectories else 0.0
    ),
  }
  for k in range(max_staleness + 1):
    out[f"async/staleness_hist/{k}"] = sum(1 for s in stale if s == k) / max(1, len(stale))
  out["async/staleness_hist/over"] = sum(1 for s in stale if s > max_staleness) / max(1, len(stale))
  return out


def mask_stale_segments(arrays: dict | None, trajs: list, step: int, max_staleness: int) -> tuple[dict | None, dict]:
  """(arrays with the action tokens of turns older than the bound at `step` ((step - 1) - v >
  max_staleness) taken out of `action_mask` (a copy; target-aligned: a turn's tokens [a, b) of the
  trajectory are positions [a - 1, b - 1)), {"async/stale_tokens_masked": how many}). `trajs`: the
  trajectories of `arrays`' rows, in order."""
  if arrays is None:
    return arrays, {"async/stale_tokens_masked": 0.0}
  mask = np.array(arrays["action_mask"], bool)
  masked = 0
  for i, t in enumerate(trajs):
    spans = turn_spans(t.action_mask)
    if len(t.policy_versions) != len(spans):
      continue  # versions not recorded per turn: nothing to judge
    for (a, b), v in zip(spans, t.policy_versions):
      if (step - 1) - v > max_staleness:
        masked += int(mask[i, a - 1 : b - 1].sum())
        mask[i, a - 1 : b - 1] = False
  return {**arrays, "action_mask": mask}, {"async/stale_tokens_masked": float(masked)}


def kept_trajectories(trajs: list, *, dynamic_sampling: bool, score_metric: str) -> list:
  """The trajectories whose rows `stages.prepare` put into its arrays, in order (the same scores
  decide which groups dynamic sampling drops)."""
  trajs = [t for t in trajs if len(t.token_ids)]  # as stages.prepare: a chain with no tokens has no row
  if not dynamic_sampling:
    return trajs
  from agentfly_jax.rl.batching import drop_zero_variance_groups
  from agentfly_jax.rl.stages import scored

  return drop_zero_variance_groups(scored(trajs, score_metric))[0]


def check_partial(rollout_spec, agent_fn=None) -> None:
  """What partial rollouts do not (yet) run with: ValueError naming the setting. The stream runs the
  built-in chains only: no endpoint agent (task.agent_fn), no shared opening turns."""
  if agent_fn is not None:
    raise ValueError("config.rollout.partial=True: not with an endpoint agent (task.agent_fn); use partial=False")
  if rollout_spec.shared_turns:
    raise ValueError("config.rollout.partial=True: not with rollout.shared_turns (set it 0)")


def start_producer(run, loop, start: int) -> PartialRolloutProducer:
  """The partial producer of `run` (rl/run.Run: its agent, sampler weights, spec, rows), rows from
  the loop's data position, versions from step `start`."""
  from agentfly_jax.agents.stream_rollout import stream_groups
  from agentfly_jax.rl.run import rows_at
  from agentfly_jax.sampling.protocol import SamplingParams

  spec, r, p = run.spec, run.spec.rollout, run.parts
  check_partial(r, getattr(p.task, "agent_fn", None))
  pos0 = loop.data_position
  params = SamplingParams(
    temperature=r.temperature,
    top_p=r.top_p,
    top_k=r.top_k,
    max_new_tokens=r.max_tokens_per_turn,
    stop_token_ids=(p.end_of_turn_id,),
  )

  def run_stream(sampler, next_group, on_group, may_start, stopped):
    import trio

    trio.run(
      functools.partial(
        stream_groups,
        p.agent,
        next_group,
        on_group,
        may_start,
        stopped,
        sampler=sampler,
        num_chains=r.num_chains,
        max_turns=r.max_turns,
        sampling_params=params,
        max_tokens_per_turn=r.max_tokens_per_turn,
        max_total_tokens=r.max_total_tokens,
        concurrency=r.concurrency,
        env_provider=p.env_provider,
        seed=spec.seed * 1_000_003 + start,
        chain_timeout_s=r.chain_timeout_s,
        reward_only_fields=p.task.reward_only_fields,
      )
    )

  run.weights.load(jax.tree.map(jnp.copy, loop.state.params))  # a copy: the train step donates the params
  return PartialRolloutProducer(
    run_stream,
    lambda k: rows_at(run, pos0 + k, 1)[0],
    run.weights,
    rows_per_step=r.rows_per_step,
    max_staleness=r.max_staleness,
    start_version=start,
  ).start()


def after_prepare(arrays: dict | None, trajs: list, step: int, spec, metrics: dict) -> dict | None:
  """The trainer's hook after `stages.prepare` (rl/loop.run_step): with partial rollouts,
  `mask_stale_segments` on the rows prepare kept (`kept_trajectories`) under the run's bound, its
  metric added to `metrics`; otherwise `arrays` as they are."""
  if not (spec.asynchronous and spec.rollout.partial):
    return arrays
  kept = kept_trajectories(
    trajs,
    dynamic_sampling=spec.dapo.dynamic_sampling,
    score_metric=spec.loss.score_metric,
  )
  arrays, stale = mask_stale_segments(arrays, kept, step, spec.rollout.max_staleness)
  metrics.update(stale)
  return arrays


def batch_metrics(producer, batch: StepBatch, step: int, spec, plain: Callable) -> dict:
  """The async/* metrics of a step's batch: the partial producer's per-turn ones
  (`staleness_metrics`), else `plain` (async_rollout.staleness_metrics)."""
  if spec.rollout.partial:
    return staleness_metrics(batch, step, spec.rollout.max_staleness, producer.gate.loads)
  return plain(batch, step, spec.rollout.max_staleness)
