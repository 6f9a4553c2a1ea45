"""A black-box agent written only with the `openai` SDK, through the endpoint over the real JAX
sampler: every chain's recorded ids are the sampler's (masks exactly on the completions), and it
trains 2 GRPO steps on the lookup task through experiments/train.py (slow)."""

import os

import numpy as np
import pytest

from endpoint_testlib import WARMSTART, assert_segment_is_sampler_output
from sampler_testing import RecordingSampler
from train_cli import ROOT, read_metrics, train_command

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.mark.slow
def test_jax_sampler_through_the_endpoint_records_exactly_the_sampled_ids():
  from agentfly_jax.agents import load_tokenizer
  from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
  from agentfly_jax.models import from_pretrained
  from agentfly_jax.sampling import JaxSampler, SamplingParams
  from agentfly_jax.tasks import lookup
  from agentfly_jax.tasks.lookup_agent import run as openai_lookup_agent

  tok = load_tokenizer(WARMSTART)
  agent = lookup.make_agent(tok)
  sampler = RecordingSampler(JaxSampler(from_pretrained(WARMSTART, "float32"), tok, max_batch_size=16, max_len=256))
  rows = lookup.make_rows(8, seed=11)
  trajs = run_endpoint_rollout(
    agent,
    rows,
    openai_lookup_agent,
    sampler=sampler,
    num_chains=2,
    sampling_params=SamplingParams(temperature=1.0),
    max_turns=3,
    max_tokens_per_turn=48,
    max_total_tokens=256,
  )
  assert len(trajs) >= 16 and {(t.group_id, t.chain_id) for t in trajs} == {(g, c) for g in range(8) for c in range(2)}
  assert sum(t.num_turns for t in trajs) == len(sampler.calls)  # every request is in a record
  for t in trajs:
    assert_segment_is_sampler_output(t, sampler.calls)
  assert any(t.tool_calls for t in trajs)  # the warm start calls the tool part of the time


@pytest.mark.slow
@pytest.mark.parametrize(
  "agent",
  [
    "agentfly_jax.tasks.lookup_agent:run",  # the openai SDK alone (an asyncio agent)
    "agentfly_jax.tasks.lookup_agents_sdk:run",  # the OpenAI Agents SDK: Agent + function_tool + Runner.run
  ],
)
def test_openai_sdk_agent_trains_two_grpo_steps_through_train_py(tmp_path, agent):
  import subprocess

  out = subprocess.run(
    train_command(
      tmp_path / "run",
      "--config.train.steps=2",
      "--config.rollout.rows_per_step=4",
      f"--config.task.agent={agent}",
      config="configs/lookup_endpoint_grpo.py",
    ),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  records = read_metrics(tmp_path / "run")
  steps = [r for r in records if r.get("step", 0) >= 1]
  assert [r["step"] for r in steps] == [1, 2]
  for r in steps:
    assert r["rollout/num_chains"] == 32  # 4 rows x 8 chains
    assert r["rollout/finish/agent_done"] == 1.0  # every chain ended by the agent itself
    assert np.isfinite(r["actor/pg_loss"]) and r["actor/grad_norm"] > 0
    # the trainer's own log-probs of the recorded ids equal the sampler's: no id is shifted,
    # re-tokenised or missing (a one-token shift gives differences of whole nats)
    assert r["mismatch/max_abs_diff"] < 1e-3 and r["mismatch/num_tokens"] > 0
    # the agent's own lookup calls are counted per tool
    assert r["tools/lookup/calls"] > 0 and r["tools/lookup/errors"] == 0
  assert os.path.exists(tmp_path / "run" / "checkpoints")


@pytest.mark.slow
def test_a_run_whose_chains_all_fail_stops_naming_the_error(tmp_path):
  import subprocess

  (tmp_path / "broken_agent.py").write_text(
    "async def run(client, row):  # a bug before the first request\n  raise KeyError(\"no field 'prompt' in the row\")\n"
  )
  out = subprocess.run(
    train_command(
      tmp_path / "run",
      "--config.train.steps=3",
      "--config.rollout.rows_per_step=2",
      "--config.task.agent=broken_agent:run",
      config="configs/lookup_endpoint_grpo.py",
    ),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
    env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, str(tmp_path)])},
  )
  assert out.returncode != 0
  assert "ChainsFailedError: step 1: every chain failed (16 of 16 finish=error)" in out.stderr, out.stderr[-3000:]
  assert "KeyError: \"no field 'prompt' in the row\"\n  at broken_agent.py:2 in run" in out.stderr
