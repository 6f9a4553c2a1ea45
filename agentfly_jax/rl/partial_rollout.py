"""The rollout producer of every mode: finished groups of chains for each step under a staleness policy.

    producer = RolloutProducer(source, weights, rows_per_step=R, max_staleness=k, start_version=v0).start()
    batch = producer.get(step)            # StepBatch: R finished groups, earliest deadline first
    producer.publish(step, params)        # version `step`: loaded at the next request the gate admits

One producer holds the versions (`VersionGate`), admits groups and hands each step its R finished groups; a
source starts the groups it is admitted and hands each one back when its last chain ends:
  - `BatchSource` (rollout.mode "sync" and "async"): a step's R groups start together and are rolled out
    whole by the run's own rollout (rl/run.rollout: the built-in or the endpoint agent, shared_turns, the
    step's seeds, on several processes each its share) under one version: the gate loads new weights only
    between batches. With max_staleness 0 and no thread (`inline`) it is the sync loop: `get(step)` rolls
    out the step's batch in the caller's thread on the weights `publish` loaded. In a thread with k >= 1 a
    batch rolls out during the update, the slowest chain of a batch holding it.
  - `StreamSource` (rollout.partial): one continuous rollout (agents/stream_rollout.py) keeps groups
    starting while others run; a step takes R finished groups and a long group carries over into a later
    step. New weights are loaded between sampler requests (the gate: new requests wait while the in-flight
    ones drain, then the load), so a chain cut by an update resumes its next turn with the new weights
    (the JAX samplers re-prefill the context: their prefix caches are cleared on a load; vLLM resets its
    own). With the paged engine's `weight_update="recompute"` (rollout.weight_update) nothing drains: the
    load happens at once and the rows in flight continue on the new weights after recomputing their keys /
    values; such a turn keeps the version it started on (the oldest that sampled it: the staleness bound
    holds; its tokens' `SampleResult.token_versions` say where the update landed), and each of its tokens'
    sampler log-probs is the one of the weights that drew it (the behaviour term below stays exact).

The staleness contract: every turn a step trains on was sampled by a version v with
(step - 1) - v <= max_staleness, and every sampled turn is trained (none is masked or dropped; with
max_staleness 0 this is the sync loop). It is kept by scheduling, as AReaL bounds staleness at
admission, made exact by deadlines:
  - a group started while the newest version is v is due at step v + k + 1 (its turns are sampled by
    v or newer: a request never starts on weights older than the newest published);
  - admission (`may_start`): n groups start only while the steps up to their deadline can take every
    group started and not consumed (ahead + n <= R * (v + k + 2 - next_step)): an earliest-deadline-first
    schedule of them exists (whole batches, n = R: the batch of step s starts once s - 1 - v <= k);
  - consumption (`choose_groups`): a step takes the R earliest-deadline finished groups, and waits while
    a group due now is unfinished or what is left would overfill a later step. While it waits no
    group is admitted (the bound is full), so the sampler runs only the late chains: the carried-over
    chains go first by construction;
  - `check_staleness` asserts the contract on every batch.
Off-policyness inside the bound is corrected in the loss: every turn records the version that sampled
it (`Trajectory.policy_versions`: the sampler result's `policy_version`; a whole batch's) and its tokens'
sampler log-probs are that version's, the behaviour term of decoupled PPO (rl/core/losses.decoupled_ppo_loss,
clipped against the proximal policy, the trainer's params when the batch arrives).
On a resume the stream restarts at the checkpoint's data position (R rows per step done); chains in
flight at the save are not kept. No group starts past the run's last step (`total_groups`).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from agentfly_jax.agents.busy_clock import BusyClock
from agentfly_jax.sampling.protocol import agenerate_with_images

POLL_S = 0.002  # how often a waiting source re-checks admission and the gate


@dataclasses.dataclass
class StepBatch:
  step: int
  trajectories: list
  version: int  # the oldest policy version that wrote a turn of this batch
  waited_s: float  # the trainer's wait for it in `get`


class VersionGate:
  """The weights a rollout samples with: `await request()` (or `try_request()`, from a thread) before each
  sampler call or whole batch (loads a newer published version once nothing is in flight, or at once for an
  engine whose weight_update is "recompute" unless `drain` says otherwise; waits while the loaded version is
  too stale for the next step to consume), `done(turns)` after it. One thread calls it (trio's or a source's)."""

  def __init__(self, weights, max_staleness: int, start_version: int, drain: bool | None = None):
    self.weights, self.max_staleness = weights, max_staleness
    self.lock = threading.Lock()
    self.published: tuple[int, object] = (start_version, None)  # set by the trainer thread
    self.next_step = start_version + 1  # the step whose batch the trainer takes next
    self.loaded = start_version
    self.in_flight = 0
    self.loads = 0
    self.loads_in_flight = 0  # loads made while requests were in flight (the engine's recompute)
    self.served = 0  # model turns sampled (requests done; a whole batch's turns)
    self.recomputed = 0  # turns an update landed in mid-request (the engine's token_versions changed)
    if drain is None:
      engine = getattr(weights.sampler, "engine_config", None)
      drain = getattr(engine, "weight_update", "drain") != "recompute"
    self.drain = drain
    self.clock = BusyClock("rollout-sampler")  # busy while >= 1 request is in flight

  def try_request(self) -> int | None:
    """The version a request starting now samples with (a newer published one loaded first where allowed),
    or None while it must wait."""
    while True:
      with self.lock:
        version, params = self.published
        next_step = self.next_step
      if version > self.loaded:  # drain, then load (new requests wait here meanwhile)
        if (self.in_flight > 0 and self.drain) or not self.weights.lock.acquire(blocking=False):
          return None
        try:
          if params is not None:
            self.weights.load(params)
        finally:
          self.weights.lock.release()
        self.loads_in_flight += self.in_flight > 0
        self.loaded, self.loads = version, self.loads + 1
        continue
      if (next_step - 1) - self.loaded > self.max_staleness or not self.weights.lock.acquire(blocking=False):
        return None
      self.in_flight += 1  # the sampler's lock is held while requests are in flight (an eval waits)
      self.clock.__enter__()
      return self.loaded

  async def request(self) -> int:
    import trio

    while (version := self.try_request()) is None:
      await trio.sleep(POLL_S)
    return version

  def done(self, turns: int = 1) -> None:
    self.in_flight -= 1
    self.served += turns
    self.clock.__exit__()
    self.weights.lock.release()


class VersionedSampler:
  """`sampler` behind a `VersionGate`: each result carries `policy_version`, the version that wrote it."""

  def __init__(self, sampler, gate: VersionGate):
    self.sampler, self.gate = sampler, gate

  def __getattr__(self, name):
    return getattr(self.sampler, name)

  async def agenerate(self, prompt, params, images=None, prompt_routes=None):
    version = await self.gate.request()
    try:
      result = await agenerate_with_images(self.sampler, prompt, params, images, prompt_routes)
    finally:
      self.gate.done()
    result.policy_version = version
    self.gate.recomputed += len(set(getattr(result, "token_versions", ()) or ())) > 1
    return result


class RolloutProducer:
  """The producer of step batches (see the module docstring): `source.run(producer)` in the producer's
  thread, or, `inline`, `source.step(producer)` in the caller's thread at each `get` (no thread: sync).
  `total_groups`: how many groups the run consumes (None: unbounded), none started past it; `drain`: the
  gate's (None: the engine's weight_update decides; whole batches always drain). Errors in the thread are
  re-raised by `get`; inline, the source's own error is raised."""

  def __init__(
    self,
    source,
    weights,
    *,
    rows_per_step: int,
    max_staleness: int,
    start_version: int,
    total_groups: int | None = None,
    inline: bool = False,
    drain: bool | None = None,
  ):
    if max_staleness < 0:
      raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    self._source, self._weights = source, weights
    self.rows_per_step, self.max_staleness, self.total_groups = rows_per_step, max_staleness, total_groups
    self.gate = VersionGate(weights, max_staleness, start_version, drain)
    self._cond = threading.Condition()  # guards the counters below; taken before gate.lock, never after
    self._deadline: dict[int, int] = {}  # started, not consumed: group id -> the last step that may take it
    self._ready: dict[int, list] = {}  # finished, not consumed: group id -> trajectories (in finishing order)
    self._started = self._consumed = 0
    self.trainer_waits = 0  # steps that waited for a due group after R others had finished
    self.trained_turns = 0  # model turns of the batches handed out
    self._error: BaseException | None = None
    self._stop = False
    self._t0 = time.perf_counter()
    self._thread = None
    if not inline:
      self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

  @property
  def busy_s(self) -> float:
    return self.gate.clock.busy_s()

  @property
  def idle_s(self) -> float:
    return max(0.0, time.perf_counter() - self._t0 - self.busy_s)

  @property
  def stopped(self) -> bool:
    return self._stop

  @property
  def exhausted(self) -> bool:
    """Every group the run consumes has started."""
    return self.total_groups is not None and self._started >= self.total_groups

  def start(self) -> "RolloutProducer":
    self._t0 = time.perf_counter()
    if self._thread is not None:
      self._thread.start()
    return self

  def publish(self, version: int, params, copy: bool = True) -> None:
    """Update `version` is done; the gate loads it (a copy unless `copy` is False: the caller keeps `params`
    unchanged, the sync loop) at the next request it admits."""
    if copy:
      params = jax.tree.map(jnp.copy, params)
    with self.gate.lock:
      self.gate.published = (version, params)

  def get(self, step: int) -> StepBatch:
    """`rows_per_step` finished groups for step `step`, earliest deadline first (group ids renumbered
    0..R-1 in that order): every group due at `step` is among them (waited for), and the groups left leave
    every later step feasible (`choose_groups`). Raises AssertionError if a token is past the bound."""
    t0 = time.perf_counter()
    if self._thread is None and not self._source.step(self):  # inline: the step's batch, here and now
      raise RuntimeError(f"rollout: step {step}'s batch may not start (staleness bound or the run's last step)")
    with self._cond:
      waited = False
      while True:
        if self._error is not None:
          raise RuntimeError("the rollout failed") from self._error
        chosen = choose_groups(self._deadline, list(self._ready), step, self.rows_per_step)
        if chosen is not None:
          break
        waited = waited or len(self._ready) >= self.rows_per_step
        self._cond.wait()
      self.trainer_waits += waited
      groups = [self._ready.pop(g) for g in chosen]
      for g in chosen:
        del self._deadline[g]
      self._consumed += self.rows_per_step
      with self.gate.lock:
        self.gate.next_step = step + 1
      self._cond.notify_all()
    trajs = [dataclasses.replace(t, group_id=i) for i, group in enumerate(groups) for t in group]
    versions = [v for t in trajs for v in t.policy_versions]
    check_staleness(versions, step, self.max_staleness)
    self.trained_turns += len(versions)
    oldest = min(versions) if versions else step - 1
    return StepBatch(step, trajs, oldest, time.perf_counter() - t0)

  def close(self) -> None:
    with self._cond:
      self._stop = True
      self._cond.notify_all()
    if self._thread is not None and self._thread.is_alive():
      self._thread.join(timeout=600)

  # ---------------------------------------------------------------- the sources' side
  def may_start(self, n: int = 1) -> bool:
    """Admission: n groups started now under the newest version v are due at step v + k + 1; they may
    start only while the steps up to then can take every group started and not consumed, these too:
    ahead + n <= R * (v + k + 2 - next_step) (the bound is then kept without dropping a token)."""
    with self._cond:
      if self.total_groups is not None and self._started + n > self.total_groups:
        return False
      ahead = self._started - self._consumed
      with self.gate.lock:
        version, next_step = self.gate.published[0], self.gate.next_step
    return ahead + n <= self.rows_per_step * (version + self.max_staleness + 2 - next_step)

  def start_groups(self, n: int = 1) -> list[int]:
    """Ids of n groups starting now (call after `may_start(n)`), each due at the newest version + k + 1:
    their requests sample with it or a newer one."""
    with self._cond:
      ids = list(range(self._started, self._started + n))
      self._started += n
      with self.gate.lock:
        due = self.gate.published[0] + self.max_staleness + 1
      self._deadline.update({k: due for k in ids})
    return ids

  def finish(self, group_id: int, trajs: list) -> None:
    """Group `group_id`'s trajectories, its last chain ended."""
    with self._cond:
      self._ready[group_id] = trajs
      self._cond.notify_all()

  def _run(self):
    try:
      self._source.run(self)
    except BaseException as e:  # noqa: BLE001 - handed to the trainer thread
      with self._cond:
        self._error = e
        self._cond.notify_all()


class BatchSource:
  """Whole step batches (sync, async): `rollout_batch(step)` -> the step's trajectories (group ids 0..R-1,
  a group's in order), run under one version (the gate admits the batch as one request: a newer version is
  loaded only between batches); the steps from `first_step` on, in order."""

  def __init__(self, rollout_batch: Callable[[int], list], first_step: int):
    self.rollout_batch, self.next_step = rollout_batch, first_step

  def step(self, producer: RolloutProducer) -> bool:
    """Rolls out the next step's batch if admitted now (False if not, or stopped)."""
    rows = producer.rows_per_step
    if not producer.may_start(rows):
      return False
    ids = producer.start_groups(rows)
    while (version := producer.gate.try_request()) is None:  # an evaluation holds the sampler
      if producer.stopped:
        return False
      time.sleep(POLL_S)
    trajs: list = []
    try:
      trajs = self.rollout_batch(self.next_step)
      for t in trajs:
        t.policy_versions = [version] * max(1, t.num_turns)
    finally:
      producer.gate.done(sum(len(t.policy_versions) for t in trajs))
    for i, g in enumerate(ids):
      producer.finish(g, [t for t in trajs if t.group_id == i])
    self.next_step += 1
    return True

  def run(self, producer: RolloutProducer) -> None:
    while not producer.stopped and not producer.exhausted:
      if not self.step(producer):
        time.sleep(POLL_S)


class StreamSource:
  """Partial rollouts: `run_stream(sampler, next_group, on_group, may_start, stopped)` runs
  agents/stream_rollout.stream_groups with the run's settings (trio.run in the producer's thread) on the
  gated sampler; `row_at(k)` is the k-th group's row."""

  def __init__(self, run_stream: Callable, row_at: Callable[[int], dict]):
    self.run_stream, self.row_at = run_stream, row_at

  def run(self, producer: RolloutProducer) -> None:
    def next_group():
      k = producer.start_groups(1)[0]
      return self.row_at(k), k

    sampler = VersionedSampler(producer.gate.weights.sampler, producer.gate)
    self.run_stream(sampler, next_group, producer.finish, producer.may_start, lambda: producer.stopped)


def choose_groups(deadlines: dict, ready: list, step: int, rows: int) -> list | None:
  """The `rows` finished groups step `step` takes, or None while it must wait. deadlines: every group
  started and not consumed -> the last step that may take it; ready: the finished ones, in finishing
  order. The choice is the `rows` earliest-deadline finished groups (finishing order breaks ties); it stands
  when what is left fits the steps after: for every deadline d, the groups left due by d <= rows * (d - step)
  (so a group due at `step` is always taken, and no later step is ever handed more than it can take).

  >>> choose_groups({0: 3, 1: 2, 2: 3}, [0, 2], step=2, rows=2)   # group 1 is due at step 2: wait for it
  >>> choose_groups({0: 3, 1: 2, 2: 3}, [0, 1, 2], step=2, rows=2)
  [1, 0]
  """
  if len(ready) < rows:
    return None
  order = {g: i for i, g in enumerate(ready)}
  chosen = sorted(ready, key=lambda g: (deadlines[g], order[g]))[:rows]
  taken = set(chosen)
  left = sorted(d for g, d in deadlines.items() if g not in taken)
  for i, d in enumerate(left):  # i + 1 groups left are due by d
    if i + 1 > rows * (d - step):
      return None
  return chosen


def check_staleness(versions: list, step: int, max_staleness: int) -> None:
  """AssertionError if a token of step `step`'s batch was sampled by a version older than the bound:
  (step - 1) - v > max_staleness (admission and `choose_groups` keep it; this checks them)."""
  over = [v for v in versions if (step - 1) - v > max_staleness]
  if over:
    raise AssertionError(
      f"rollout: step {step} holds turns of version {min(over)} "
      f"(staleness {(step - 1) - min(over)}) past max_staleness={max_staleness}"
    )


def staleness_metrics(batch: StepBatch, step: int, max_staleness: int, weight_loads: int) -> dict:
  """async/* metrics of a step's batch: staleness of its oldest turn, the share of turns per
  staleness (each within the bound: `check_staleness`), the share of chains that span several
  versions, the producer's weight loads so far (`weight_loads`)."""
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
  return out


def producer_metrics(producer: RolloutProducer, batch: StepBatch, step: int) -> dict:
  """The async/* metrics of a step's batch (`staleness_metrics`), the steps that waited for a due group,
  the loads made while requests ran (the engine's recompute) and the turns an update landed in, and the
  model turns sampled and trained so far: equal once nothing is in flight (no sampled turn wasted)."""
  out = staleness_metrics(batch, step, producer.max_staleness, producer.gate.loads)
  gate = producer.gate
  out["async/trainer_waits"] = float(producer.trainer_waits)
  out["async/weight_loads_in_flight"] = float(gate.loads_in_flight)
  out["async/turns_recomputed"] = float(gate.recomputed)
  out["async/sampled_turns"] = float(gate.served)
  out["async/trained_turns"] = float(producer.trained_turns)
  return out


def check_partial(rollout_spec, agent_fn=None) -> None:
  """What partial rollouts do not (yet) run with: ValueError naming the setting. The stream runs the
  built-in chains only: no endpoint agent (task.agent_fn)."""
  if agent_fn is not None:
    raise ValueError("config.rollout.partial=True: not with an endpoint agent (task.agent_fn); use partial=False")


def stream_source(run, position: int, start: int) -> StreamSource:
  """The partial rollouts' source of `run` (rl/run.Run: its agent, spec, rows): the k-th group's row at data
  position `position` + k, request seeds from step `start`'s."""
  from agentfly_jax.agents.stream_rollout import stream_groups
  from agentfly_jax.rl.run import rows_at
  from agentfly_jax.sampling.protocol import SamplingParams

  spec, r, p = run.spec, run.spec.rollout, run.parts
  check_partial(r, getattr(p.task, "agent_fn", None))
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
        shared_turns=r.shared_turns,
        chain_timeout_s=r.chain_timeout_s,
        reward_only_fields=p.task.reward_only_fields,
      )
    )

  return StreamSource(run_stream, lambda k: rows_at(run, position + k, 1)[0])
