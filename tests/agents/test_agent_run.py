"""`agent.rollout` for prototyping: rows / a question / a conversation in, trajectories + rewards + a
transcript per chain out, with exactly the model-written tokens marked; `from_pretrained` builds
an agent + JAX sampler from an HF folder in one line."""

import re

import pytest
from agent_testlib import agent_tokenizer, hermes_call, tokenizer_dir
from agentfly_jax import reward, tool
from agentfly_jax.agents import ToolCallAgent
from agentfly_jax.sampling.scripted import ScriptedSampler

EOT = "<|im_end|>"


@tool
def weather(city: str) -> str:
  """The weather of a city.

  Args:
    city: the city.
  """
  return f"sunny in {city}"


@reward
def mentions_sun(prediction: str, city: str) -> dict:
  return {"reward": float("sunny" in prediction and city in prediction), "length": len(prediction)}


def _script(turns):
  tok = agent_tokenizer("qwen2.5")

  def script(prompt_ids):
    text = tok.decode(prompt_ids)
    k = text.count("<|im_start|>assistant") - 1
    city = re.findall(r"weather in (\w+)", text)[-1]
    reply = turns[min(k, len(turns) - 1)].replace("CITY", city)
    return tok.encode(reply + EOT)

  return script


def test_run_returns_trajectories_rewards_and_marked_transcripts():
  agent = ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[weather], reward_fn=mentions_sun)
  sampler = ScriptedSampler(_script([hermes_call("weather", {"city": "CITY"}), "It is sunny in CITY."]))
  rows = [
    {"question": "What is the weather in Oslo?", "city": "Oslo"},
    {"question": "What is the weather in Rome?", "city": "Rome"},
  ]
  result = agent.rollout(rows, num_chains=3, max_turns=3, sampler=sampler)
  assert len(result) == 6 and result.rewards == [1.0] * 6
  assert [t.group_id for t in result.trajectories] == [0, 0, 0, 1, 1, 1]
  tok = agent.tokenizer
  for t, text in zip(result.trajectories, result.transcripts):
    marked = re.findall(r"⟦(.*?)⟧", text, flags=re.S)
    assert "".join(marked) == tok.decode(t.generated_token_ids)  # marked = exactly the trained-on tokens
    assert len(marked) == 2 and "sunny in" in marked[1] and f"sunny in {t.row['city']}" in text
    assert "<tool_response>" in text and "<tool_response>" not in "".join(marked)  # observation unmarked
  assert str(result).count("reward 1.000") == 6


def test_run_takes_a_question_or_a_conversation_and_needs_a_sampler():
  agent = ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[weather])
  sampler = ScriptedSampler(_script(["It is sunny in CITY."]))
  one = agent.rollout("What is the weather in Paris?", sampler=sampler)
  assert len(one) == 1 and one.trajectories[0].row == {"question": "What is the weather in Paris?"}
  convo = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi."},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "The weather in Lima?"},
  ]
  out = agent.rollout(convo, num_chains=2, sampler=sampler)
  assert [m["content"] for m in out.trajectories[0].messages[:4]] == [m["content"] for m in convo]
  assert "Be brief." in out.transcripts[0] and "sunny in Lima" in out.transcripts[1]
  with pytest.raises(ValueError, match="no sampler"):
    agent.rollout("q")
  with pytest.raises(TypeError, match="agent.rollout: expected"):
    agent.rollout(42, sampler=sampler)


@pytest.mark.slow
def test_from_pretrained_folder_in_one_line(tmp_path):
  """An HF folder (tiny random model + tokenizer) -> agent with a JAX sampler; tools and reward by name."""
  from flax import nnx
  from agentfly_jax.models import CausalLM, save_pretrained, tiny_config

  model = CausalLM(
    tiny_config(
      "qwen2",
      vocab_size=agent_tokenizer("qwen2.5").vocab_size,
      hidden_size=64,
      intermediate_size=128,
      num_hidden_layers=1,
      num_attention_heads=2,
      num_key_value_heads=1,
      head_dim=32,
    ),
    rngs=nnx.Rngs(0),
  )
  folder = save_pretrained(model, tmp_path / "model", tokenizer_dir=tokenizer_dir("qwen2.5"))
  agent = ToolCallAgent.from_pretrained(
    str(folder), tools=["calculator"], reward="exact_match", sampler_kwargs={"max_len": 512, "max_batch_size": 4}
  )
  result = agent.rollout(
    [{"question": "What is 2+3?", "answer": "5"}],
    num_chains=2,
    max_turns=2,
    max_tokens_per_turn=8,
    max_total_tokens=400,
  )
  assert len(result) == 2 and all(r in (0.0, 1.0) for r in result.rewards)
  for t in result.trajectories:
    assert t.finish_reason != "error", t.error
    n = int(t.action_mask.sum())
    assert n >= 1 and (t.sampler_logprobs[t.action_mask] < 0).all()
    assert "calculator" in result.transcripts[0]
