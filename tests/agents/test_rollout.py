"""The rollout: token-in/token-out trajectories, concurrency of tools and chains, finish reasons,
failures isolated per chain, env binding, per-row tools."""

import time

import numpy as np
import pytest
import transformers
import trio

from agent_testlib import agent_tokenizer, hermes_call, tokenizer_dir
from agentfly_jax import reward, tool
from agentfly_jax.agents import ToolCallAgent, rollout, run_rollout
from agentfly_jax.sampling import SamplingParams
from agentfly_jax.sampling.scripted import ScriptedSampler, scripted_logprob
from agentfly_jax.tools import LocalEnvProvider, LocalMemoryEnv, answer, calculator
from agentfly_jax.rewards import exact_match

QWEN = "qwen2.5"
EOT = "<|im_end|>"


def _script(template, turns):
  """A sampler script: reply k (as text) for a prompt that already holds k model turns."""
  tok = agent_tokenizer(template)
  marker = "<|im_start|>assistant" if template == QWEN else "<|start_header_id|>assistant"
  eot = EOT if template == QWEN else "<|eot_id|>"

  def script(prompt_ids):
    k = tok.decode(prompt_ids).count(marker) - 1
    return tok.encode(turns[min(k, len(turns) - 1)] + eot)

  return script


def assert_masked_tokens_are_sampler_outputs(trajectory, sampler_calls):
  """The masked-in tokens, in order, are exactly the concatenated sampler outputs, and the
  stored log-probs sit on the same positions."""
  generated = np.concatenate([np.asarray(r.token_ids) for _, r in sampler_calls])
  logprobs = np.concatenate([np.asarray(r.logprobs, np.float32) for _, r in sampler_calls])
  np.testing.assert_array_equal(trajectory.token_ids[trajectory.action_mask], generated)
  np.testing.assert_array_equal(trajectory.sampler_logprobs[trajectory.action_mask], logprobs)
  assert np.all(trajectory.sampler_logprobs[~trajectory.action_mask] == 0)


@pytest.mark.parametrize("template", [QWEN, "llama3"])
def test_masked_tokens_equal_sampler_outputs_and_text_equals_hf_rendering(template):
  turns = [
    hermes_call("calculator", {"expression": "(7 * 6) - 2"})
    + "\n"
    + hermes_call("calculator", {"expression": "2 ** 10"}),
    "Two results: 40 and 1024.\n" + hermes_call("calculator", {"expression": "40 + 1024"}),
    "The answer is 1064.",
  ]
  agent = ToolCallAgent(
    tokenizer_dir(template),
    tools=[calculator, answer],
    system_prompt="Use tools.",
    template_kwargs={"date_string": "01 Jan 2025"},
  )
  sampler = ScriptedSampler(_script(template, turns))
  [traj] = run_rollout(
    agent,
    [{"question": "Compute (7*6)-2 and 2**10."}],
    sampler=sampler,
    num_chains=1,
    max_turns=5,
    max_total_tokens=4096,
  )
  assert traj.finish_reason == "no_tool_call" and traj.num_turns == 3 and traj.error is None
  assert_masked_tokens_are_sampler_outputs(traj, sampler.calls)
  # each sampler call saw exactly the trajectory prefix up to its own tokens
  for prompt, result in sampler.calls:
    n = len(prompt)
    assert list(traj.token_ids[:n]) == prompt
    assert list(traj.token_ids[n : n + len(result.token_ids)]) == result.token_ids
  assert [c["observation"] for c in traj.tool_calls] == ["40", "1024", "1064"]
  assert traj.prediction == "The answer is 1064."
  assert traj.prompt_length == len(sampler.calls[0][0])
  # the scripted model writes exactly what the template writes, so the whole token sequence
  # decodes to HF's rendering of the final conversation (observations built from the template)
  # (Qwen style; the Llama template re-renders calls as {"name", "parameters"}). The last "\n"
  # after the final <|im_end|> is template text nobody appended: the chain ended.
  if template == QWEN:
    hf = transformers.AutoTokenizer.from_pretrained(tokenizer_dir(template))
    expected = hf.apply_chat_template(traj.messages, tools=[calculator.schema, answer.schema], tokenize=False)
    assert agent_tokenizer(template).decode(traj.token_ids) + "\n" == expected


def test_a_one_token_mask_shift_is_detected():
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[calculator])
  sampler = ScriptedSampler(_script(QWEN, [hermes_call("calculator", {"expression": "1+1"}), "done"]))
  [traj] = run_rollout(agent, [{"question": "1+1?"}], sampler=sampler, max_turns=3)
  assert_masked_tokens_are_sampler_outputs(traj, sampler.calls)
  for shift in (1, -1):
    shifted = traj.__class__(
      token_ids=traj.token_ids,
      action_mask=np.roll(traj.action_mask, shift),
      sampler_logprobs=np.roll(traj.sampler_logprobs, shift),
    )
    with pytest.raises(AssertionError):
      assert_masked_tokens_are_sampler_outputs(shifted, sampler.calls)


def test_logprobs_are_the_samplers_and_seeds_differ_per_chain():
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[calculator])
  seen_seeds = []

  class SeedRecorder(ScriptedSampler):
    async def agenerate(self, prompt, params):
      seen_seeds.append(params.seed)
      assert EOT in [agent.tokenizer.decode([t]) for t in params.stop_token_ids]
      return await super().agenerate(prompt, params)

  sampler = SeedRecorder(_script(QWEN, ["plain answer"]))
  trajs = run_rollout(
    agent,
    [{"question": "a"}, {"question": "b"}],
    sampler=sampler,
    num_chains=3,
    sampling_params=SamplingParams(temperature=0.7),
    seed=5,
  )
  assert [(t.group_id, t.chain_id) for t in trajs] == [(g, c) for g in range(2) for c in range(3)]
  assert len(set(seen_seeds)) == 6
  t = trajs[0]
  gen = t.token_ids[t.action_mask]
  expected = [scripted_logprob(t.prompt_length, i, int(x)) for i, x in enumerate(gen)]
  np.testing.assert_allclose(t.sampler_logprobs[t.action_mask], expected, rtol=1e-6)


def _sleep_tools():
  @tool
  async def slow_lookup(key: str) -> str:
    """Looks a key up slowly.

    Args:
      key: what to look up.
    """
    await trio.sleep(0.5)
    return f"value of {key}"

  @tool
  def slow_sync(key: str) -> str:
    """A blocking slow tool.

    Args:
      key: what to look up.
    """
    time.sleep(0.5)
    return f"sync {key}"

  return slow_lookup, slow_sync


def test_two_half_second_tool_calls_in_one_turn_take_half_a_second():
  slow_lookup, slow_sync = _sleep_tools()
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[slow_lookup, slow_sync])
  turn = hermes_call("slow_lookup", {"key": "a"}) + hermes_call("slow_sync", {"key": "b"})
  sampler = ScriptedSampler(_script(QWEN, [turn, "ok"]))
  start = time.perf_counter()
  [traj] = run_rollout(agent, [{"question": "q"}], sampler=sampler, max_turns=3)
  elapsed = time.perf_counter() - start
  assert [c["observation"] for c in traj.tool_calls] == ["value of a", "sync b"]
  assert 0.5 <= elapsed < 0.85, f"two 0.5 s calls took {elapsed:.2f} s (sequential would be 1 s)"


def test_256_chains_with_a_slow_tool_overlap():
  slow_lookup, _ = _sleep_tools()
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[slow_lookup, answer])
  turns = [
    hermes_call("slow_lookup", {"key": "x"}),
    hermes_call("slow_lookup", {"key": "y"}),
    hermes_call("answer", {"answer": "done"}),
  ]
  sampler = ScriptedSampler(_script(QWEN, turns), delay_s=0.05)
  rows = [{"question": f"question {i}"} for i in range(64)]
  start = time.perf_counter()
  trajs = run_rollout(agent, rows, sampler=sampler, num_chains=4, max_turns=4, concurrency=256)
  elapsed = time.perf_counter() - start
  assert len(trajs) == 256 and all(t.finish_reason == "finish_tool" for t in trajs)
  # own turns: 3 generations x 0.05 s + 2 tool calls x 0.5 s = 1.15 s; the sum would be ~294 s
  assert elapsed < 10.0, f"256 chains took {elapsed:.1f} s"


def test_one_failing_chain_does_not_stop_the_others(caplog):
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[calculator], reward_fn=exact_match)
  good = _script(QWEN, ["42"])

  def script(prompt):
    if "explode" in agent.tokenizer.decode(prompt):
      raise RuntimeError("sampler exploded")
    return good(prompt)

  rows = [
    {"question": "fine", "answer": "42"},
    {"question": "explode", "answer": "42"},
    {"question": "fine too", "answer": "42"},
  ]
  trajs = run_rollout(agent, rows, sampler=ScriptedSampler(script), num_chains=2)
  assert [t.finish_reason for t in trajs] == ["no_tool_call"] * 2 + ["error"] * 2 + ["no_tool_call"] * 2
  assert [t.reward for t in trajs] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
  assert "sampler exploded" in trajs[2].error and trajs[2].prompt_length > 0
  assert "failed" in caplog.text


def test_finish_reasons_and_budgets():
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[calculator, answer])
  loop_call = hermes_call("calculator", {"expression": "1+1"})
  [t] = run_rollout(agent, [{"question": "q"}], sampler=ScriptedSampler(_script(QWEN, [loop_call])), max_turns=3)
  assert t.finish_reason == "max_turns" and t.num_turns == 3
  assert t.messages[-1]["role"] == "tool"  # last turn's tools ran, no tokens appended after
  assert t.action_mask[-1]
  [t] = run_rollout(
    agent, [{"question": "q"}], sampler=ScriptedSampler(_script(QWEN, ["word " * 200])), max_tokens_per_turn=16
  )
  assert t.finish_reason == "max_tokens_per_turn" and t.action_mask.sum() == 16
  prompt_len = t.prompt_length
  [t] = run_rollout(
    agent,
    [{"question": "q"}],
    sampler=ScriptedSampler(_script(QWEN, [loop_call])),
    max_turns=10,
    max_total_tokens=prompt_len + 60,
  )
  assert t.finish_reason == "max_total_tokens" and len(t) <= prompt_len + 60
  [t] = run_rollout(
    agent, [{"question": "q"}], sampler=ScriptedSampler(_script(QWEN, ["x"])), max_total_tokens=prompt_len
  )  # the prompt alone fills the context
  assert t.finish_reason == "max_total_tokens" and t.num_turns == 0 and t.prediction == ""
  assert not t.action_mask.any()
  [t] = run_rollout(
    agent, [{"question": "q"}], sampler=ScriptedSampler(_script(QWEN, [hermes_call("answer", {"answer": "Paris"})]))
  )
  assert t.finish_reason == "finish_tool" and t.prediction == "Paris"


def test_malformed_and_unknown_calls_become_error_observations():
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[calculator])
  turns = [
    '<tool_call>{"name": "calculator", "arguments": {oops}</tool_call>'
    + hermes_call("nope", {})
    + hermes_call("calculator", {"expression": 3}),
    "ok",
  ]
  sampler = ScriptedSampler(_script(QWEN, turns))
  [t] = run_rollout(agent, [{"question": "q"}], sampler=sampler, max_turns=3)
  assert t.finish_reason == "no_tool_call"
  observations = [m["content"] for m in t.messages if m["role"] == "tool"]
  assert any("unknown tool 'nope'" in o for o in observations)
  assert any("argument 'expression' must be of type string" in o for o in observations)
  assert any("not valid JSON" in o for o in observations)
  assert "unknown tool 'nope'" in agent.tokenizer.decode(sampler.calls[1][0])


def test_per_row_tool_restriction():
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[calculator, answer])
  sampler = ScriptedSampler(_script(QWEN, [hermes_call("answer", {"answer": "x"}), "gave up"]))
  rows = [{"question": "q", "tools": ["calculator"]}, {"question": "q"}]
  trajs = run_rollout(agent, rows, sampler=sampler, max_turns=3)
  prompts = [agent.tokenizer.decode(p) for p, _ in sampler.calls]
  restricted = [p for p in prompts if '"name": "answer"' not in p.split("</tools>")[0]]
  assert restricted, "row 0's prompt must not list the answer tool"
  assert trajs[0].finish_reason == "no_tool_call" and "unknown tool 'answer'" in trajs[0].tool_calls[0]["observation"]
  assert trajs[1].finish_reason == "finish_tool"
  with pytest.raises(ValueError, match="row 0.*unknown tool"):
    run_rollout(agent, [{"question": "q", "tools": ["web_search"]}], sampler=sampler)


def test_stateful_tools_and_env_reward_share_the_chains_instance():
  @tool(env="memory")
  async def remember(key: str, value: str, env) -> str:
    """Stores a value.

    Args:
      key: name.
      value: what to store.
    """
    return await env.step({"op": "set", "key": key, "value": value})

  @tool(env="memory")
  async def recall(key: str, env) -> str:
    """Reads a value.

    Args:
      key: name.
    """
    return await env.step({"op": "get", "key": key})

  @reward(env="memory")
  async def stored_keys(env, prediction):
    return {"reward": (await env.compute_reward("num_keys"))["reward"], "steps": env.num_steps}

  provider = LocalEnvProvider({"memory": LocalMemoryEnv})
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[remember, recall], reward_fn=stored_keys)

  def script(prompt):
    text = agent.tokenizer.decode(prompt)
    chain_word = "alpha" if "alpha" in text else "beta"
    k = text.count("<|im_start|>assistant") - 1
    turns = [
      hermes_call("remember", {"key": "k", "value": chain_word}) + hermes_call("remember", {"key": "k2", "value": "v"}),
      hermes_call("recall", {"key": "k"}),
      "bye",
    ]
    return agent.tokenizer.encode(turns[min(k, 2)] + EOT)

  trajs = run_rollout(
    agent,
    [{"question": "alpha"}, {"question": "beta"}],
    sampler=ScriptedSampler(script),
    num_chains=2,
    max_turns=4,
    env_provider=provider,
  )
  for t in trajs:
    word = t.row["question"]
    assert t.tool_calls[-1]["observation"] == word  # its own instance, not another chain's
    assert t.reward == 2.0 and t.reward_metrics == {"steps": 3}
    assert t.env_names == ["memory"]  # the rollout metrics count allocated environments from this
  assert provider.num_created == 4 and provider.num_released == 4 and not provider.acquired


def test_async_rollout_inside_trio_and_bad_arguments():
  agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[calculator])
  sampler = ScriptedSampler(_script(QWEN, ["hi"]))

  async def main():
    return await rollout(agent, [{"question": "q"}], sampler=sampler, num_chains=2)

  trajs = trio.run(main)
  assert len(trajs) == 2
  with pytest.raises(ValueError, match="num_chains"):
    run_rollout(agent, [{"question": "q"}], sampler=sampler, num_chains=0)
  with pytest.raises(ValueError, match="rollout: row 1 has no field 'question'"):
    run_rollout(agent, [{"question": "q"}, {"prompt": "x"}], sampler=sampler)
  with pytest.raises(ValueError, match="row 0.*needs dataset field 'answer'"):
    run_rollout(
      ToolCallAgent(tokenizer_dir(QWEN), tools=[], reward_fn=exact_match), [{"question": "q"}], sampler=sampler
    )


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(
  st.lists(st.lists(st.integers(0, 599), min_size=1, max_size=30), min_size=1, max_size=4),
  st.sampled_from([QWEN, "llama3"]),
)
def test_arbitrary_sampler_ids_never_break_a_chain(replies, template):
  """Any ids (special tokens, broken UTF-8 bytes, half tool calls) give a finished, aligned
  trajectory, never an error."""
  tok = agent_tokenizer(template)
  call = tok.encode(hermes_call("calculator", {"expression": "2*3"}))
  replies = [r + call if i % 2 else r for i, r in enumerate(replies)]  # some turns call a tool
  agent = ToolCallAgent(tokenizer_dir(template), tools=[calculator, answer])
  sampler = ScriptedSampler(replies)
  [t] = run_rollout(agent, [{"question": "q"}], sampler=sampler, max_turns=len(replies), max_tokens_per_turn=40)
  assert t.error is None and t.finish_reason != "error"
  assert_masked_tokens_are_sampler_outputs(t, sampler.calls)


def test_an_environment_step_that_says_done_ends_the_chain():
  """A tool that returns its env's StepResult ends the chain when the step is `done` (finish
  reason "env_done", no tokens after the last observation); the same result read as its
  observation string, or a step that is not done, lets the chain go on."""
  from agentfly_jax.envs.base import StepResult

  class GameEnv:
    def __init__(self):
      self.moves = 0

    async def reset(self, row=None):
      self.moves = 0
      return ""

    async def step(self, action):
      self.moves += 1
      return StepResult(observation=f"move {self.moves}", done=self.moves >= 2)

    async def compute_reward(self, name, **kwargs):
      return {"reward": float(self.moves)}

    async def close(self):
      pass

  @tool(env="game")
  async def move(env) -> StepResult:
    """Makes a move."""
    return await env.step("move")

  @tool(env="game", name="move_text")
  async def move_text(env) -> str:
    """Makes a move (the observation only)."""
    return (await env.step("move")).observation

  @reward(env="game")
  async def moves_made(env, prediction):
    return await env.compute_reward("moves")

  for fn, reason, turns in [(move, "env_done", 2), (move_text, "max_turns", 4)]:
    agent = ToolCallAgent(tokenizer_dir(QWEN), tools=[fn], reward_fn=moves_made)
    call = hermes_call(fn.name, {})
    [t] = run_rollout(
      agent,
      [{"question": "play"}],
      sampler=ScriptedSampler(_script(QWEN, [call] * 4)),
      max_turns=4,
      env_provider=LocalEnvProvider({"game": GameEnv}),
    )
    assert t.finish_reason == reason and t.num_turns == turns and t.reward == float(turns)
    assert t.messages[-1]["role"] == "tool" and t.messages[-1]["content"] == f"move {turns}"
    assert t.action_mask[-1]  # the chain's last token is the model's: no observation tokens after it
