"""A judge run in this process: a second model from an HF folder on its own JAX sampler (agents/sampler_judge.py),
built from config.judge.pretrained by build_task. Its prompt is the rubric rendered with the judge's own chat
template; the tiny random judge's text does not parse, so every chain scores `unparsed_score` and counts
judge/unparsed, and an equal prompt is answered from the cache."""

import pytest
import trio

from judge_server import tiny_judge_folder
from agentfly_jax.agents.sampler_judge import SamplerJudge
from agentfly_jax.rl.config import default_config
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.tasks.from_config import build_task


@pytest.mark.slow  # the judge sampler's prefill and decode compile (~20 s here)
def test_in_process_judge_from_config(tmp_path):
  folder = tiny_judge_folder(str(tmp_path / "judge"))
  c = default_config()
  c.judge.update(pretrained=folder, criteria=("quality: how good",), unparsed_score=-0.25, max_tokens=12)
  task = build_task(RunSpec.from_config(c))
  client = task.reward.calls.client
  assert isinstance(client, SamplerJudge) and client.max_tokens == 12
  row = task.make_rows(1, 0)[0]
  sent = []
  sampler_generate = client.sampler.agenerate

  async def recording(ids, params):
    sent.append((list(ids), params))
    return await sampler_generate(ids, params)

  client.sampler.agenerate = recording
  first = trio.run(task.reward.compute, "42", [], row)
  second = trio.run(task.reward.compute, "42", [], row)
  assert first["judge/unparsed"] == 1.0 and first["judge/score"] == -0.25
  assert second["judge/cache_hit"] == 1.0 and len(sent) == 1
  ids, params = sent[0]
  text = client.tokenizer.decode(ids)
  assert text.startswith("<|im_start|>system\nYou are a strict, fair judge") and "- quality (weight 1.0)" in text
  assert text.endswith("<|im_start|>assistant\n") and params.temperature == 0.0 and params.max_new_tokens == 12
