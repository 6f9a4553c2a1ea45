"""Partial rollouts (rl/partial_rollout.py): a step takes the first groups to finish while long
chains carry over and continue under newer weights; every turn records the version that sampled it
(checked against the weights the sampler held at that moment); turns past the staleness bound at
consumption leave the loss."""

import collections
import time

import numpy as np
import pytest
import trio

from agent_testlib import hermes_call, tokenizer_dir
from agentfly_jax.agents import ToolCallAgent
from agentfly_jax.agents.stream_rollout import stream_groups
from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.rl.partial_rollout import (
  PartialRolloutProducer,
  check_partial,
  mask_stale_segments,
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


def _producer(rows_per_step, max_staleness, long_every=4, long_turns=8):
  agent = ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[calculator])
  tok = agent.tokenizer

  def script(prompt_ids):
    text = tok.decode(prompt_ids)
    k = text.count("<|im_start|>assistant") - 1
    turns = long_turns if "long" in text else 1
    reply = hermes_call("calculator", {"expression": "1+1"}) if k < turns - 1 else "2"
    return tok.encode(reply + "<|im_end|>")

  sampler = _VersionedScript(script, delay_s=0.01)
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

  producer = PartialRolloutProducer(
    run_stream, row_at, weights, rows_per_step=rows_per_step, max_staleness=max_staleness, start_version=0
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
    assert abs(sum(m[f"async/staleness_hist/{k}"] for k in (0, 1)) + m["async/staleness_hist/over"] - 1) < 1e-9
  assert spanning > 0  # long chains were cut by weight updates and resumed with the new weights
  # the first step did not wait for the long chains: its groups are the short rows that finished first
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


def test_mask_stale_segments_hand_worked():
  # prompt 2 tokens, turn A (3 tokens, version 0), obs 1, turn B (2 tokens, version 2), obs 1, turn C (1, version 3)
  mask = [0, 0, 1, 1, 1, 0, 1, 1, 0, 1]
  t = Trajectory(list(range(10)), mask, np.zeros(10), policy_versions=[0, 2, 3])
  arrays = {"action_mask": np.array([mask[1:]], bool)}
  out, m = mask_stale_segments(arrays, [t], step=4, max_staleness=1)  # staleness 3, 1, 0: turn A leaves
  np.testing.assert_array_equal(out["action_mask"][0], [0, 0, 0, 0, 0, 1, 1, 0, 1])
  assert m == {"async/stale_tokens_masked": 3.0}
  assert arrays["action_mask"].sum() == 6  # the caller's arrays untouched
  assert t.action_mask.sum() == 6  # and the Trajectory keeps its contract
  same, m0 = mask_stale_segments(arrays, [t], step=4, max_staleness=3)
  assert m0["async/stale_tokens_masked"] == 0 and same["action_mask"].sum() == 6


def test_partial_refuses_what_it_does_not_run():
  from agentfly_jax.rl.spec import RolloutSection

  check_partial(RolloutSection(mode="async", partial=True))
  with pytest.raises(ValueError, match="endpoint agent"):
    check_partial(RolloutSection(mode="async", partial=True), agent_fn=lambda client, row: "")
  with pytest.raises(ValueError, match="shared_turns"):
    check_partial(RolloutSection(mode="async", partial=True, shared_turns=1))
