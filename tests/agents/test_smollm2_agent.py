"""SmolLM2-135M-Instruct as a tool-using policy: its chat template ignores `tools`, so the
arithmetic task's agent writes the calculator schema (and a worked example) into the prompt. A
rollout on each sampler (JAX; vLLM slow-marked) keeps the token-in/token-out contract: every model
turn's masked-in ids are exactly the ids the sampler returned, and the whole token stream decodes
to the text transformers' `apply_chat_template` renders for the trajectory's messages.

SmolLM2-135M does not call the calculator on its own in any prompt format measured
(lab/results/smollm2_tool_formats.md: 0 calls greedy, 0 of 16 sampled at T=1), so the
first turn's call is the task's scripted demo (through `ScriptedPolicySampler`) and SmolLM2 writes
every turn after the tool's observation: the stream holds prompt, a call, a real calculator
observation rendered by the template, and SmolLM2's own tokens."""

import numpy as np
import pytest

from agentfly_jax.agents import load_tokenizer, run_rollout
from agentfly_jax.sampling.protocol import SamplingParams
from agentfly_jax.tasks import arithmetic


class RecordingSampler:
  """Turn 0 (no tool response after the question yet) from `first`, later turns from `sampler`;
  records (prompt ids, returned ids) per request."""

  def __init__(self, first, sampler, tokenizer):
    self.first, self.sampler, self.tokenizer, self.calls = first, sampler, tokenizer, []

  async def agenerate(self, prompt, params):
    text = self.tokenizer.decode(list(prompt))
    after_question = text[text.rfind("What is") :]
    engine = self.sampler if "<tool_response>" in after_question else self.first
    result = await engine.agenerate(prompt, params)
    self.calls.append((tuple(int(t) for t in prompt), [int(t) for t in result.token_ids]))
    return result


def _turns(action_mask):
  """[(start, end)] of each maximal run of True."""
  runs, start = [], None
  for i, m in enumerate(list(action_mask) + [False]):
    if m and start is None:
      start = i
    elif not m and start is not None:
      runs.append((start, i))
      start = None
  return runs


def _rollout_and_check(sampler, smollm2_dir):
  from transformers import AutoTokenizer

  tok = load_tokenizer(smollm2_dir)
  hf = AutoTokenizer.from_pretrained(smollm2_dir)
  agent = arithmetic.make_agent(tok, tool_format="hermes", fewshot=True)
  rows = arithmetic.make_rows(4, seed=2024)
  from agentfly_jax.rl.sft import ScriptedPolicySampler

  demo = ScriptedPolicySampler(
    tok, lambda text, rng: arithmetic.scripted_response(text, True, rng), tok.token_to_id("<|im_end|>")
  )
  recorder = RecordingSampler(demo, sampler, tok)
  trajs = run_rollout(
    agent,
    rows,
    sampler=recorder,
    num_chains=1,
    max_turns=2,
    sampling_params=SamplingParams(temperature=0.0, max_new_tokens=40),
    max_tokens_per_turn=40,
    max_total_tokens=512,
    seed=0,
  )
  by_prompt = dict(recorder.calls)
  assert len(by_prompt) == len(recorder.calls) == sum(t.num_turns for t in trajs)
  for t in trajs:
    assert t.finish_reason != "error", t.error
    turns = _turns(t.action_mask)
    assert len(turns) == t.num_turns
    for start, end in turns:  # masked ids == the sampler's ids, turn by turn
      assert list(t.token_ids[start:end]) == by_prompt[tuple(int(x) for x in t.token_ids[:start])]
    # the token stream == HF's rendering of the messages (up to the last model turn)
    last = max(i for i, m in enumerate(t.messages) if m["role"] == "assistant")
    rendered = hf.apply_chat_template(t.messages[: last + 1], tokenize=False)
    text = hf.decode(t.token_ids.tolist())
    ended = int(t.token_ids[-1]) == hf.convert_tokens_to_ids("<|im_end|>")
    assert rendered == text + ("\n" if ended else "<|im_end|>\n")
    assert np.all(t.sampler_logprobs[~t.action_mask] == 0)
  return trajs


@pytest.mark.slow
def test_smollm2_tool_rollout_jax_sampler(smollm2_dir):
  from agentfly_jax.models import from_pretrained
  from agentfly_jax.sampling import JaxSampler

  model = from_pretrained(smollm2_dir)
  sampler = JaxSampler(model, load_tokenizer(smollm2_dir), max_batch_size=4, max_len=640, batch_buckets=(4,))
  trajs = _rollout_and_check(sampler, smollm2_dir)
  for t in trajs:  # a real calculator observation, then a SmolLM2 turn
    assert [c["ok"] for c in t.tool_calls] == [True] and t.num_turns == 2, t.messages[-2:]
    assert t.tool_calls[0]["observation"] == t.row["answer"]


@pytest.mark.slow
@pytest.mark.vllm
def test_smollm2_tool_rollout_vllm_sampler(smollm2_dir):
  pytest.importorskip("vllm")
  from agentfly_jax.sampling import VllmSampler

  # the batch engine, in this process: the contract is the sampler's ids, whichever engine returns them (the async
  # engine's agenerate gives generate's tokens: tests/sampling/test_vllm_sampler.py), and no engine process starts
  sampler = VllmSampler(smollm2_dir, engine="batch", max_model_len=640, max_num_seqs=8, max_batch_size=4, seed=0)
  try:
    trajs = _rollout_and_check(sampler, smollm2_dir)
  finally:
    sampler.close()
  assert all(t.num_turns == 2 and t.tool_calls[0]["ok"] for t in trajs)
