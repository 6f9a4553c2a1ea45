"""`rollout.shared_turns`: a group's chains draw their first K turns with the same seeds, so with a
deterministic environment they share that opening and branch after it (the built-in loop and the
OpenAI-compatible endpoint); `group_branch_turns` measures where a group's chains first differ."""

import collections

import numpy as np
import pytest

from agent_testlib import hermes_call, tokenizer_dir
from agentfly_jax.agents import ToolCallAgent, run_rollout
from agentfly_jax.agents.endpoint import ChatEndpoint
from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
from agentfly_jax.rl.batching import group_branch_turns, rollout_metrics
from agentfly_jax.sampling import SamplingParams
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import lookup
from agentfly_jax.tasks.lookup_agent import run as openai_lookup_agent
from agentfly_jax.tools import calculator

from endpoint_testlib import WARMSTART

EOT = "<|im_end|>"


class SeededSampler(ScriptedSampler):
  """A stochastic policy that is a function of (request seed, prompt), as a seeded sampler is:
  each turn draws one of 50 calculator calls from the seed; turn 3 answers in plain text."""

  def __init__(self, tok):
    self.tok = tok
    super().__init__(self._reply)

  def _reply(self, prompt_ids):
    turn = self.tok.decode(prompt_ids).count("<|im_start|>assistant") - 1
    if turn >= 3:
      return self.tok.encode("done" + EOT)
    x = np.random.default_rng(self._seed).integers(0, 50)
    return self.tok.encode(hermes_call("calculator", {"expression": f"{x} + {turn}"}) + EOT)

  async def agenerate(self, prompt, params):
    self._seed = params.seed
    return self._sample(prompt, params)


@pytest.fixture(scope="module")
def agent():
  return ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[calculator])


def _rollout(agent, shared_turns, seed=11):
  return run_rollout(
    agent,
    [{"question": f"q{i}"} for i in range(3)],
    sampler=SeededSampler(agent.tokenizer),
    num_chains=4,
    max_turns=5,
    sampling_params=SamplingParams(temperature=1.0),
    seed=seed,
    shared_turns=shared_turns,
    concurrency=1,  # one chain at a time: the sampler's seed attribute is never raced
  )


def test_chains_share_the_first_turns_and_branch_after(agent):
  shared = _rollout(agent, shared_turns=2)
  groups = collections.defaultdict(list)
  for t in shared:
    groups[t.group_id].append(t)
  assert len(groups) == 3 and all(len(g) == 4 for g in groups.values())
  for chains in groups.values():
    calls = [[(c["turn"], c["arguments"]["expression"]) for c in t.tool_calls] for t in chains]
    assert all(len(c) == 3 for c in calls)  # three calls, then the plain answer
    assert len({tuple(c[:2]) for c in calls}) == 1  # the opening: the same two calls in every chain
    assert len({c[2] for c in calls}) > 1  # turn 2 drawn per chain
  assert group_branch_turns(shared) == [2, 2, 2]
  assert rollout_metrics(shared)["rollout/group_branch_turn_mean"] == 2.0
  own = _rollout(agent, shared_turns=0)
  assert group_branch_turns(own) == [0, 0, 0]
  # chain 0 keeps its own seeds: its trajectory is the same with or without a shared opening
  for a, b in zip(shared, own):
    if a.chain_id == 0:
      assert a.token_ids.tolist() == b.token_ids.tolist()


def test_a_streams_groups_share_their_openings_as_whole_batches_do(agent):
  """Partial rollouts' stream (agents/stream_rollout.stream_groups) with shared_turns: each group's chains share
  their first turns and branch after, with the seeds the whole-batch rollout gives the same group ids."""
  import trio

  from agentfly_jax.agents.stream_rollout import stream_groups

  rows = [{"question": f"q{i}"} for i in range(3)]
  got, started = [], []

  def next_group():
    started.append(len(started))
    return rows[started[-1]], started[-1]

  with pytest.raises(ValueError, match="stream_groups: shared_turns=2 needs a base seed"):
    trio.run(
      lambda: stream_groups(
        agent,
        next_group,
        None,
        None,
        None,
        sampler=None,
        num_chains=4,
        max_turns=5,
        sampling_params=SamplingParams(),
        max_tokens_per_turn=64,
        max_total_tokens=4096,
        seed=None,
        shared_turns=2,
      )
    )
  trio.run(
    lambda: stream_groups(
      agent,
      next_group,
      lambda group_id, trajs: got.extend(trajs),
      lambda: len(started) < len(rows),
      lambda: len(got) == 4 * len(rows),
      sampler=SeededSampler(agent.tokenizer),
      num_chains=4,
      max_turns=5,
      sampling_params=SamplingParams(temperature=1.0),
      max_tokens_per_turn=64,
      max_total_tokens=4096,
      concurrency=1,
      seed=11,
      shared_turns=2,
    )
  )
  assert group_branch_turns(got) == [2, 2, 2]
  batch = {(t.group_id, t.chain_id): t.token_ids.tolist() for t in _rollout(agent, shared_turns=2)}
  assert {(t.group_id, t.chain_id): t.token_ids.tolist() for t in got} == batch


def test_branch_turns_count_model_turns_and_skip_single_chains(agent):
  trajs = _rollout(agent, shared_turns=9)  # past the last turn: the chains never differ
  assert group_branch_turns(trajs) == [4, 4, 4]  # 3 calls + the answer, identical in all 4 chains
  assert group_branch_turns([t for t in trajs if t.chain_id == 0]) == []
  assert "eval/group_branch_turn_mean" not in rollout_metrics([t for t in trajs if t.chain_id == 0], prefix="eval")


def test_bad_shared_turns_are_named(agent):
  with pytest.raises(ValueError, match="shared_turns must be an int >= 0, got -1"):
    _rollout(agent, shared_turns=-1)
  with pytest.raises(ValueError, match="shared_turns=2 needs a base seed"):
    _rollout(agent, shared_turns=2, seed=None)
  with pytest.raises(ValueError, match="ChatEndpoint: shared_turns must be an int >= 0, got 1.5"):
    ChatEndpoint(agent, SeededSampler(agent.tokenizer), shared_turns=1.5)


def test_endpoint_agents_share_their_first_requests_seeds():
  tok = ToolCallAgent(WARMSTART, tools=[]).tokenizer
  agent = lookup.make_agent(tok)
  eot = tok.token_to_id("<|im_end|>")
  seen = collections.defaultdict(list)  # (question, request index) -> the seeds sent

  class Recorder(ScriptedSampler):
    async def agenerate(self, prompt, params):
      text = tok.decode(prompt)
      question = next(r["question"] for r in rows if r["question"] in text)
      seen[question, text.count("<|im_start|>assistant") - 1].append(params.seed)
      return await super().agenerate(prompt, params)

  def script(prompt_ids):
    reply = lookup.scripted_response(tok.decode(prompt_ids), True, np.random.default_rng(0))
    return tok.encode(reply if isinstance(reply, str) else "".join(p for p, _ in reply)) + [eot]

  rows = lookup.make_rows(2, seed=3)
  sampler = Recorder(script)
  trajs = run_endpoint_rollout(agent, rows, openai_lookup_agent, sampler=sampler, num_chains=3, seed=4, shared_turns=1)
  assert len(trajs) == 6 and all(t.num_turns == 2 for t in trajs)
  a, b = (r["question"] for r in rows)
  assert len(set(seen[a, 0])) == len(set(seen[b, 0])) == 1 and seen[a, 0] != seen[b, 0]  # one seed a group
  assert len(seen[a, 0]) == len(seen[b, 0]) == 3
  assert len(set(seen[a, 1] + seen[b, 1])) == 6  # each chain's own seed after the shared request


class TemperatureRecorder(SeededSampler):
  """SeededSampler that records each request's (turn, temperature)."""

  def __init__(self, tok):
    super().__init__(tok)
    self.temperatures = []

  async def agenerate(self, prompt, params):
    turn = self.tok.decode(prompt).count("<|im_start|>assistant") - 1
    self.temperatures.append((turn, params.temperature))
    return await super().agenerate(prompt, params)


def test_shared_turns_keep_the_sampling_temperature_at_every_turn(agent):
  sampler = TemperatureRecorder(agent.tokenizer)
  rows = [{"question": f"q{i}"} for i in range(2)]
  kw = dict(sampler=sampler, num_chains=3, max_turns=5, seed=5, concurrency=1)
  run_rollout(agent, rows, sampling_params=SamplingParams(temperature=0.7), shared_turns=2, **kw)
  assert len(sampler.temperatures) == 24  # 2 x 3 chains, 4 model turns each
  assert {t for _, t in sampler.temperatures} == {0.7}


def test_run_rollouts_sample_at_the_spec_temperature_and_greedy_evals_stay_greedy(agent):
  from agentfly_jax.rl import stages
  from agentfly_jax.rl.spec import RolloutSection

  spec = RolloutSection(
    num_chains=2,
    max_turns=5,
    max_tokens_per_turn=64,
    max_total_tokens=2048,
    temperature=0.9,
    shared_turns=1,
  )
  sampler = TemperatureRecorder(agent.tokenizer)
  kw = dict(sampler=sampler, rollout_spec=spec, end_of_turn_id=agent.tokenizer.token_to_id(EOT), env_provider=None)
  stages.rollout(agent, [{"question": "q"}], **kw)
  assert sorted(set(sampler.temperatures)) == [(0, 0.9), (1, 0.9), (2, 0.9), (3, 0.9)]
  sampler.temperatures.clear()
  stages.rollout(agent, [{"question": "q"}], temperature=0.0, num_chains=1, **kw)  # the greedy eval's call
  assert {t for _, t in sampler.temperatures} == {0.0}


def test_endpoint_requests_of_shared_chains_are_sampled_at_the_run_temperature():
  tok = ToolCallAgent(WARMSTART, tools=[]).tokenizer
  agent = lookup.make_agent(tok)
  eot = tok.token_to_id("<|im_end|>")
  temperatures = collections.defaultdict(set)

  class Recorder(ScriptedSampler):
    async def agenerate(self, prompt, params):
      temperatures[tok.decode(prompt).count("<|im_start|>assistant") - 1].add(params.temperature)
      return await super().agenerate(prompt, params)

  def script(prompt_ids):
    reply = lookup.scripted_response(tok.decode(prompt_ids), True, np.random.default_rng(0))
    return tok.encode(reply if isinstance(reply, str) else "".join(p for p, _ in reply)) + [eot]

  rows = lookup.make_rows(2, seed=3)
  run_endpoint_rollout(
    agent,
    rows,
    openai_lookup_agent,
    sampler=Recorder(script),
    num_chains=2,
    seed=4,
    sampling_params=SamplingParams(temperature=0.8),
    shared_turns=1,
  )
  assert dict(temperatures) == {0: {0.8}, 1: {0.8}}
