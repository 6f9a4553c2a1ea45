"""Partial rollouts (rl/partial_rollout.py): a step takes finished groups while long chains carry over
and continue under newer weights; every turn records the version that sampled it (checked against the
weights the sampler held at that moment); admission and earliest-deadline consumption keep every trained
turn within the staleness bound without dropping any sampled turn. The same producer's whole batches: sync
(no thread: each `get` rolls out its step on the last update) and async (a thread, one version per batch)."""

import collections
import threading
import time
import types

import numpy as np
import pytest
import trio

from agent_testlib import hermes_call, tokenizer_dir
from agentfly_jax.agents import ToolCallAgent
from agentfly_jax.agents.stream_rollout import stream_groups
from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.rl.partial_rollout import (
  BatchSource,
  RolloutProducer,
  StreamSource,
  check_partial,
  check_staleness,
  choose_groups,
  producer_metrics,
  staleness_metrics,
)
from agentfly_jax.rl.stages import SamplerWeights
from agentfly_jax.sampling import SamplingParams
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tools import calculator


class _VersionedScript(ScriptedSampler):
  """Records the weights' version it held when each request ran."""

  def __init__(self, script, delay_s):
    super().__init__(script, delay_s)
    self.held, self.seen = -1, []

  def update_weights(self, params):
    super().update_weights(params)
    self.held = int(np.asarray(params["v"]))

  async def agenerate(self, prompt, params):
    held = self.held
    result = await super().agenerate(prompt, params)
    assert self.held == held, "weights changed while a request was in flight"
    self.seen.append(held)
    return result


class _RecomputeScript(ScriptedSampler):
  """An engine with weight_update="recompute": weights may change while a request runs; records the version
  held when each request started and when it ended."""

  engine_config = types.SimpleNamespace(weight_update="recompute")

  def __init__(self, script, delay_s):
    super().__init__(script, delay_s)
    self.held, self.seen, self.spans = -1, [], []

  def update_weights(self, params):
    super().update_weights(params)
    self.held = int(np.asarray(params["v"]))

  async def agenerate(self, prompt, params):
    start = self.held
    result = await super().agenerate(prompt, params)
    self.seen.append(start)
    self.spans.append((start, self.held))
    return result


def _producer(
  rows_per_step, max_staleness, long_every=4, long_turns=8, total_groups=None, delay_s=0.01, sampler_cls=None
):
  agent = ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[calculator])
  tok = agent.tokenizer

  def script(prompt_ids):
    text = tok.decode(prompt_ids)
    k = text.count("<|im_start|>assistant") - 1
    turns = long_turns if "long" in text else 1
    reply = hermes_call("calculator", {"expression": "1+1"}) if k < turns - 1 else "2"
    return tok.encode(reply + "<|im_end|>")

  sampler = (sampler_cls or _VersionedScript)(script, delay_s=delay_s)
  weights = SamplerWeights(sampler)
  weights.load({"v": np.int32(0)})

  def run_stream(s, next_group, on_group, may_start, stopped):
    trio.run(
      lambda: stream_groups(
        agent,
        next_group,
        on_group,
        may_start,
        stopped,
        sampler=s,
        num_chains=2,
        max_turns=long_turns,
        sampling_params=SamplingParams(temperature=1.0),
        max_tokens_per_turn=64,
        max_total_tokens=4096,
      )
    )

  def row_at(k):
    return {"question": f"row {k} " + ("long" if k % long_every == long_every - 1 else "short")}

  producer = RolloutProducer(
    StreamSource(run_stream, row_at),
    weights,
    rows_per_step=rows_per_step,
    max_staleness=max_staleness,
    start_version=0,
    total_groups=total_groups,
  )
  return producer, sampler


def test_groups_carry_over_and_turns_record_their_version():
  producer, sampler = _producer(rows_per_step=3, max_staleness=1)
  producer.start()
  batches = []
  try:
    for step in range(1, 7):
      batch = producer.get(step)
      batches.append(batch)
      time.sleep(0.03)  # the update
      producer.publish(step, {"v": np.int32(step)})
  finally:
    producer.close()
  spanning = 0
  for step, batch in enumerate(batches, 1):
    trajs = batch.trajectories
    assert len(trajs) == 3 * 2 and sorted({t.group_id for t in trajs}) == [0, 1, 2]
    assert all(len(t.policy_versions) == t.num_turns >= 1 for t in trajs)
    for t in trajs:
      assert t.policy_versions == sorted(t.policy_versions)  # a chain only moves to newer weights
      assert max(t.policy_versions) <= step - 1
      spanning += len(set(t.policy_versions)) > 1
    m = staleness_metrics(batch, step, 1, producer.gate.loads)
    assert abs(sum(m[f"async/staleness_hist/{k}"] for k in (0, 1)) - 1) < 1e-9  # every turn within the bound
  assert spanning > 0  # long chains were cut by weight updates and resumed with the new weights
  # the first step did not wait for the long chains: its groups are short rows that finished first
  assert all("short" in t.row["question"] for t in batches[0].trajectories)
  assert any("long" in t.row["question"] for b in batches[1:] for t in b.trajectories)
  # every recorded version is one the sampler held when a request ran (the run may cut chains never consumed)
  recorded = collections.Counter(v for b in batches for t in b.trajectories for v in t.policy_versions)
  assert not recorded - collections.Counter(sampler.seen)
  assert producer.gate.loads >= 5


def test_max_staleness_0_never_samples_during_an_update():
  producer, sampler = _producer(rows_per_step=2, max_staleness=0, long_every=3, long_turns=3)
  producer.start()
  try:
    for step in range(1, 5):
      batch = producer.get(step)
      n = len(sampler.seen)
      time.sleep(0.05)
      assert len(sampler.seen) == n  # no request ran while the trainer updated
      producer.publish(step, {"v": np.int32(step)})
      for t in batch.trajectories:
        assert all(v == step - 1 for v in t.policy_versions), t.policy_versions
  finally:
    producer.close()


def test_an_engine_that_recomputes_loads_new_weights_without_draining():
  producer, sampler = _producer(rows_per_step=3, max_staleness=1, delay_s=0.05)
  drained = producer.gate.drain
  producer, sampler = _producer(rows_per_step=3, max_staleness=1, delay_s=0.05, sampler_cls=_RecomputeScript)
  assert drained and not producer.gate.drain
  batches = _run_steps(producer, 5, update_s=0.03)
  assert producer.gate.loads >= 4 and producer.gate.loads_in_flight > 0  # loaded while requests ran
  assert any(end > start for start, end in sampler.spans)  # a request finished on newer weights
  for step, batch in enumerate(batches, 1):
    # a turn keeps the version it started on: the bound holds
    check_staleness([v for t in batch.trajectories for v in t.policy_versions], step, 1)
    for t in batch.trajectories:
      assert t.policy_versions == sorted(t.policy_versions) and max(t.policy_versions) <= step - 1
  recorded = collections.Counter(v for b in batches for t in b.trajectories for v in t.policy_versions)
  assert not recorded - collections.Counter(sampler.seen)  # each the version a request started on


def _run_steps(producer, steps, update_s):
  batches = []
  producer.start()
  try:
    for step in range(1, steps + 1):
      batches.append(producer.get(step))
      time.sleep(update_s)  # the update
      producer.publish(step, {"v": np.int32(step)})
  finally:
    producer.close()
  return batches


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_heavy_tailed_stream_trains_every_sampled_turn_within_the_bound(max_staleness):
  """Every 5th row's chains take 12 turns (a long chain outlives several updates), the others 1. Every
  turn the sampler ran is trained (nothing is masked or cut at the end: waste <= 10 %, here 0) and every
  trained turn's staleness at its step is <= max_staleness, while long groups still carry over."""
  steps, rows = 10, 3
  producer, sampler = _producer(
    rows, max_staleness, long_every=5, long_turns=12, total_groups=steps * rows, delay_s=0.004
  )
  batches = _run_steps(producer, steps, update_s=0.03)
  trained = sum(t.num_turns for b in batches for t in b.trajectories)
  assert len(sampler.seen) > 0 and 1 - trained / len(sampler.seen) <= 0.10, (trained, len(sampler.seen))
  assert trained == len(sampler.seen)  # no group started past the run's last step, none dropped
  m = producer_metrics(producer, batches[-1], steps)  # the run's metrics say so too
  assert m["async/sampled_turns"] == m["async/trained_turns"] == trained
  staleness = [step - 1 - v for step, b in enumerate(batches, 1) for t in b.trajectories for v in t.policy_versions]
  assert max(staleness) <= max_staleness, collections.Counter(staleness)
  assert sum(len(set(t.policy_versions)) > 1 for b in batches for t in b.trajectories) > 0  # chains carried over
  groups = [t.row["question"] for b in batches for t in b.trajectories if t.chain_id == 0]
  assert len(groups) == len(set(groups)) == steps * rows  # each row once, none lost
  assert sum("long" in q for q in groups) == sum(k % 5 == 4 for k in range(steps * rows))


class _HeldWeights:
  """A sampler that only holds a version (whole batches are rolled out by the test's own function)."""

  def __init__(self):
    self.held, self.updates = -1, 0

  def update_weights(self, params):
    self.held, self.updates = int(np.asarray(params["v"])), self.updates + 1


def _batch_producer(rows, max_staleness, inline, delay_s=0.0, steps=None):
  """A whole-batch producer (sync / async): each step's batch is `rows` groups of 2 chains, recorded as
  (step, the version the sampler held, the thread) when it is rolled out."""
  sampler, calls = _HeldWeights(), []
  weights = SamplerWeights(sampler)
  weights.load({"v": np.int32(0)})

  def rollout_batch(step):
    calls.append((step, sampler.held, threading.current_thread().name))
    time.sleep(delay_s)
    return [
      Trajectory(
        np.zeros(3, np.int32),
        np.zeros(3, bool),
        np.zeros(3, np.float32),
        group_id=i,
        chain_id=c,
        num_turns=1 + (i + c) % 2,
        row={"step": step, "row": i},
      )
      for i in range(rows)
      for c in range(2)
    ]

  producer = RolloutProducer(
    BatchSource(rollout_batch, first_step=1),
    weights,
    rows_per_step=rows,
    max_staleness=max_staleness,
    start_version=0,
    total_groups=None if steps is None else steps * rows,
    inline=inline,
    drain=True,
  )
  return producer, weights, calls


def test_sync_is_the_producer_inline_each_step_rolled_out_by_get_on_the_last_update():
  producer, weights, calls = _batch_producer(rows=3, max_staleness=0, inline=True, steps=4)
  producer.start()
  try:
    for step in range(1, 5):
      batch = producer.get(step)
      assert calls[-1] == (step, step - 1, threading.current_thread().name)  # here, now, on the last update
      assert [(t.group_id, t.chain_id) for t in batch.trajectories] == [(i, c) for i in range(3) for c in range(2)]
      assert [t.row for t in batch.trajectories] == [{"step": step, "row": i} for i in range(3) for c in range(2)]
      assert all(t.policy_versions == [step - 1] * t.num_turns for t in batch.trajectories)
      params = {"v": np.int32(step)}
      weights.load(params)  # the sync loop's push (stages.sync) ...
      producer.publish(step, params, copy=False)  # ... which the gate does not push again
    assert len(calls) == 4 and weights.sampler.updates == 1 + 4 and producer.gate.loads == 3
    with pytest.raises(RuntimeError, match="may not start"):  # no batch past the run's last step
      producer.get(5)
  finally:
    producer.close()


def test_async_batches_roll_out_during_the_update_each_on_one_version_within_the_bound():
  producer, _, calls = _batch_producer(rows=2, max_staleness=1, inline=False, delay_s=0.02, steps=6)
  batches = _run_steps(producer, 6, update_s=0.2)
  assert [c[0] for c in calls] == list(range(1, 7))  # each step's batch once, in order, none past the last
  assert all(name == "rollout-producer" for _, _, name in calls)
  for (step, held, _), batch in zip(calls, batches):
    assert [(t.group_id, t.chain_id) for t in batch.trajectories] == [(i, c) for i in range(2) for c in range(2)]
    assert all(t.row["step"] == step for t in batch.trajectories)  # the step's own rows
    assert {v for t in batch.trajectories for v in t.policy_versions} == {held}  # one version: the one it ran on
    assert 0 <= (step - 1) - held <= 1
  assert any((step - 1) - held == 1 for step, held, _ in calls)  # a batch rolled out during an update
  m = producer_metrics(producer, batches[-1], 6)
  assert (
    m["async/sampled_turns"] == m["async/trained_turns"] == sum(t.num_turns for b in batches for t in b.trajectories)
  )


def test_choose_groups_earliest_deadline_first_and_waits_for_a_due_group():
  rng = np.random.default_rng(5)
  assert choose_groups({0: 3, 1: 2, 2: 3}, [0, 2], step=2, rows=2) is None  # group 1 is due now
  assert choose_groups({0: 3, 1: 2, 2: 3}, [2, 1, 0], step=2, rows=2) == [1, 2]  # then finishing order
  assert choose_groups({0: 3, 1: 3}, [1], step=2, rows=2) is None  # fewer than R finished
  # what is left must fit, R = 1: two groups due at step 4 fit steps 3-4, two due at step 3 do not
  assert choose_groups({0: 4, 1: 4, 3: 5}, [3], step=2, rows=1) == [3]
  assert choose_groups({0: 3, 1: 3, 3: 5}, [3], step=2, rows=1) is None
  for _ in range(200):  # random feasible states: a choice leaves every later step feasible
    rows, step = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    n = int(rng.integers(rows, 4 * rows))
    deadlines = {g: step + int(rng.integers(0, 4)) for g in range(n)}
    left = sorted(deadlines.values())
    if any(i + 1 > rows * (d - step + 1) for i, d in enumerate(left)):
      continue  # admission never builds this state
    ready = [int(g) for g in rng.permutation(n)[: int(rng.integers(0, n + 1))]]
    chosen = choose_groups(deadlines, ready, step, rows)
    if len(ready) == n:
      assert chosen is not None  # all finished: a choice always exists
    if chosen is None:
      continue
    assert len(chosen) == rows and set(chosen) <= set(ready)
    assert all(g in chosen for g, d in deadlines.items() if d == step)
    rest = sorted(d for g, d in deadlines.items() if g not in chosen)
    assert all(i + 1 <= rows * (d - step) for i, d in enumerate(rest))


def test_check_staleness_names_the_stale_turn():
  check_staleness([3, 2, 3], step=4, max_staleness=1)
  with pytest.raises(AssertionError, match=r"step 4 holds turns of version 1 \(staleness 2\) past max_staleness=1"):
    check_staleness([3, 1, 2], step=4, max_staleness=1)


def test_partial_refuses_what_it_does_not_run():
  from agentfly_jax.rl.spec import RolloutSection

  check_partial(RolloutSection(mode="async", partial=True))
  with pytest.raises(ValueError, match="endpoint agent"):
    check_partial(RolloutSection(mode="async", partial=True), agent_fn=lambda client, row: "")
  check_partial(RolloutSection(mode="async", partial=True, shared_turns=1))  # the stream shares openings too
