"""ReactAgent and CodeAgent rollouts with scripted model text; agent construction errors."""

import numpy as np
import pytest

from agent_testlib import agent_tokenizer, tokenizer_dir
from agentfly_jax import reward, tool
from agentfly_jax.agents import CodeAgent, ReactAgent, ToolCallAgent, run_rollout
from agentfly_jax.rewards import numeric_match
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tools import LocalEnvProvider, LocalMemoryEnv, answer, calculator


def _turn_script(template, turns, eot):
  tok = agent_tokenizer(template)
  marker = "<|im_start|>assistant" if template == "qwen2.5" else "<|start_header_id|>assistant"

  def script(prompt_ids):
    k = tok.decode(prompt_ids).count(marker) - 1
    return tok.encode(turns[min(k, len(turns) - 1)] + eot)

  return script


@pytest.mark.parametrize("template, eot", [("qwen2.5", "<|im_end|>"), ("llama3", "<|eot_id|>")])
def test_react_agent_rollout(template, eot):
  agent = ReactAgent(
    tokenizer_dir(template),
    tools=[calculator],
    reward_fn=numeric_match,
    system_prompt="Be careful.",
    template_kwargs={"date_string": "01 Jan 2025"},
  )
  turns = [
    "Thought: multiply\nAction: calculator\nAction Input: 6 * 7",
    'Thought: check\nAction: calculator\nAction Input: {"expression": "42 + 0"}',
    "Thought: I know\nAction: search\nAction Input: {}",
    "Thought: done\nFinal Answer: 42",
  ]
  sampler = ScriptedSampler(_turn_script(template, turns, eot))
  [t] = run_rollout(agent, [{"question": "What is 6*7?", "answer": "42"}], sampler=sampler, max_turns=6)
  assert t.finish_reason == "final_answer" and t.prediction == "42" and t.reward == 1.0
  assert [c["observation"] for c in t.tool_calls] == ["42", "42", t.tool_calls[2]["observation"]]
  assert "unknown tool 'search'" in t.tool_calls[2]["observation"]
  system = t.messages[0]["content"]
  assert system.startswith("Be careful.") and "- calculator:" in system and "Final Answer" in system
  observations = [m["content"] for m in t.messages if m["role"] == "user"][1:]
  assert observations[0] == "Observation: 42"
  generated = np.concatenate([r.token_ids for _, r in sampler.calls])
  np.testing.assert_array_equal(t.token_ids[t.action_mask], generated)
  # the observation text reached the model as the template renders a user turn
  assert "Observation: 42" in agent.tokenizer.decode(sampler.calls[1][0])


def test_code_agent_with_a_local_code_tool():
  namespace = {}

  @tool
  def python(code: str) -> str:
    """Runs code in a persistent namespace (test stand-in; the real one is code_interpreter).

    Args:
      code: Python source.
    """
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
      exec(code, namespace)
    return buffer.getvalue()

  @reward
  def printed_42(trajectory):
    return float(any(m["content"] == "Observation:\n42\n" for m in trajectory))

  agent = CodeAgent(tokenizer_dir("qwen2.5"), tools=[python], reward_fn=printed_42)
  turns = [
    "Let me compute.\n```python\nx = 6 * 7\n```\n```python\nprint(x)\n```",
    "```python\nprint(undefined_name)\n```",
    "Final Answer: 42",
  ]
  sampler = ScriptedSampler(_turn_script("qwen2.5", turns, "<|im_end|>"))
  [t] = run_rollout(agent, [{"question": "6*7?"}], sampler=sampler, max_turns=5)
  assert t.finish_reason == "final_answer" and t.prediction == "42" and t.reward == 1.0
  assert t.tool_calls[0]["arguments"] == {"code": "x = 6 * 7\nprint(x)"}
  assert "NameError" in t.tool_calls[1]["observation"] and not t.tool_calls[1]["ok"]


def test_code_agent_with_the_builtin_sandbox():
  envs = pytest.importorskip("agentfly_jax.envs")
  if not hasattr(envs, "default_provider"):
    pytest.skip("agentfly_jax.envs.default_provider is not available yet (env-server part)")
  try:
    provider = envs.default_provider()
  except Exception as e:
    pytest.skip(f"the default env provider could not start: {e}")
  turns = ["```python\ny = 20 + 22\n```", "```python\nprint(y)\n```", "Final Answer: 42"]
  sampler = ScriptedSampler(_turn_script("qwen2.5", turns, "<|im_end|>"))
  # default tool: code_interpreter; the provider given to the agent, not the rollout
  agent = CodeAgent(tokenizer_dir("qwen2.5"), env_provider=provider)
  trajs = run_rollout(agent, [{"question": "q"}], sampler=sampler, num_chains=2, max_turns=4)
  for t in trajs:
    assert t.finish_reason == "final_answer", (t.error, t.tool_calls)
    assert t.tool_calls[1]["observation"].strip() == "42"  # state persisted within the chain


def test_agent_construction_errors():
  with pytest.raises(ValueError, match="two tools are named 'calculator'"):
    ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[calculator, calculator])
  with pytest.raises(ValueError, match="exactly one argument"):
    CodeAgent(tokenizer_dir("qwen2.5"), tools=[answer.__class__(lambda a, b: a, name="two")])
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    ToolCallAgent("/nonexistent/dir", tools=[])
  plain = ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[lambda city: city])  # wrapped with @tool
  assert "<lambda>" in plain.tools


def test_unused_provider_is_never_created():
  provider_calls = []

  class Provider(LocalEnvProvider):
    async def acquire(self, env_name, chain_id):
      provider_calls.append(env_name)
      return await super().acquire(env_name, chain_id)

  agent = ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[calculator])
  sampler = ScriptedSampler(_turn_script("qwen2.5", ["no tools"], "<|im_end|>"))
  run_rollout(agent, [{"question": "q"}], sampler=sampler, env_provider=Provider({}))
  assert provider_calls == []


def test_task_env_first_observation_reaches_the_prompt():
  class Room(LocalMemoryEnv):
    async def reset(self, row=None):
      await super().reset(row)
      return f"You are in the {row['room']}."

  @tool(env="room")
  async def look(env) -> str:
    """Looks around."""
    return f"Still in the {env.row['room']}."

  provider = LocalEnvProvider({"room": Room})
  agent = ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[look], task_env="room", env_provider=provider)
  sampler = ScriptedSampler(
    _turn_script("qwen2.5", ['<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>', "bye"], "<|im_end|>")
  )
  [t] = run_rollout(agent, [{"question": "Explore.", "room": "kitchen"}], sampler=sampler, max_turns=3)
  assert t.messages[0] == {"role": "user", "content": "Explore.\n\nYou are in the kitchen."}
  assert t.tool_calls[0]["observation"] == "Still in the kitchen."
  assert provider.num_created == 1 and provider.num_released == 1
