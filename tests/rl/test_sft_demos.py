"""The SFT warm start's demonstrations: a real rollout with the scripted policy, and the loss mask
that leaves `learn=False` pieces (the lookup demo's guessed word) out of the loss."""

import os
import types

import numpy as np
import pytest

from agentfly_jax.agents import load_tokenizer
from agentfly_jax.agents.rollout import run_rollout
from agentfly_jax.agents.trajectory import pad_batch
from agentfly_jax.rl.sft import ScriptedPolicySampler, sft_loss_mask
from agentfly_jax.sampling.protocol import SamplingParams
from agentfly_jax.tasks import lookup
from train_cli import ROOT

WARMSTART = os.path.join(ROOT, "experiments", "results", "lookup_warmstart")


def _rollout(tok, demo, rows, eot):
  agent = lookup.make_agent(tok)
  params = SamplingParams(temperature=1.0, max_new_tokens=32, stop_token_ids=(eot,))
  return run_rollout(
    agent,
    rows,
    sampler=demo,
    num_chains=1,
    max_turns=3,
    sampling_params=params,
    max_tokens_per_turn=32,
    max_total_tokens=256,
    seed=5,
  )


def test_guessed_word_is_generated_but_not_learned():
  tok = load_tokenizer(WARMSTART)
  eot = tok.token_to_id("<|im_end|>")
  key = lookup.KEYS[3]
  # the same question several times: identical prompts get different demos (tool / guess)
  rows = [{"question": f'Find the code of key "{key}".', "key": key, "answer": lookup.secret_code(key)}] * 6
  rows += lookup.make_rows(10, seed=1)
  demo = ScriptedPolicySampler(
    tok, lambda text, rng: lookup.scripted_response(text, rng.random() < 0.5, rng), eot, seed=0
  )
  trajs = _rollout(tok, demo, rows, eot)
  arr = pad_batch(trajs, max_len=128, pad_id=tok.pad_token_id)
  loss_masks = sft_loss_mask(trajs, demo, 127)  # target-aligned: position t is token t + 1
  targets, action = arr["token_ids"][:, 1:], arr["action_mask"][:, 1:]
  kinds = set()
  for i, t in enumerate(trajs):
    loss = loss_masks[i]
    dropped = np.flatnonzero(action[i] & ~loss)
    assert not (loss & ~action[i]).any()  # never adds a token
    if t.tool_calls:
      kinds.add("tool")
      assert dropped.size == 0  # tool call and copied answer are learned whole
      assert t.reward == 1.0
    else:
      kinds.add("guess")
      guess = lookup.extract_answer(t.prediction)
      assert guess in lookup.WORDS
      assert tok.decode(targets[i, dropped].tolist()) == f" {guess}"
      # the rest of the answer ("The code is", ".", end of turn) stays in the loss
      kept = tok.decode(targets[i][loss].tolist())
      assert kept.startswith("The code is.") and guess not in kept
  assert kinds == {"tool", "guess"}
  assert demo._unlearned == {}  # sft_loss_mask took and cleared the record


def test_plain_text_demo_and_bad_piece():
  tok = load_tokenizer(WARMSTART)
  eot = tok.token_to_id("<|im_end|>")
  demo = ScriptedPolicySampler(tok, lambda text, rng: lookup.scripted_response(text, True, rng), eot)
  trajs = _rollout(tok, demo, lookup.make_rows(4, seed=2), eot)
  arr = pad_batch(trajs, pad_id=tok.pad_token_id)
  width = arr["token_ids"].shape[1] - 1
  np.testing.assert_array_equal(sft_loss_mask(trajs, demo, width), arr["action_mask"][:, 1:])
  bad = ScriptedPolicySampler(tok, lambda text, rng: [("The code is", True), "apple"], eot)
  with pytest.raises(TypeError, match="piece 1 of a demo turn must be"):
    bad.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8))


class _RecordingProgram:
  """An SFT program that records the demonstrations it is given (the real rollout produced them)."""

  def __init__(self):
    self.batches = []

  def new_state(self, params):
    return types.SimpleNamespace(params=params)

  def step(self, state, trajs, demo):
    self.batches.append(trajs)
    return state, {"sft/nll": 0.0}


def test_a_policy_that_reads_its_row_writes_each_chains_own_answer():
  """`scripted_response(..., row=)` (a task whose answer is not in the prompt, e.g. in a picture): every chain's
  demo is written from its own row (rows run one at a time), and a step whose every demo chain failed stops
  the warm start, naming the failure."""
  from agentfly_jax.rl.sft import takes_row, train_on_demos

  tok = load_tokenizer(WARMSTART)
  eot = tok.token_to_id("<|im_end|>")

  def policy(text, use_tool, rng, row=None):
    return f"The answer is {row['answer']}."

  assert takes_row(policy) and not takes_row(lookup.scripted_response)
  task = types.SimpleNamespace(scripted_response=policy, make_rows=lambda n, seed: lookup.make_rows(n, seed=seed))
  sft = types.SimpleNamespace(steps=2, rows_per_step=5, tool_use_prob=1.0)

  def rollout(rows, *, sampler, num_chains, seed):
    agent = lookup.make_agent(tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=32, stop_token_ids=(eot,))
    return run_rollout(
      agent, rows, sampler=sampler, num_chains=num_chains, max_turns=1, sampling_params=params,
      max_tokens_per_turn=32, max_total_tokens=256, seed=seed,
    )  # fmt: skip

  program = _RecordingProgram()
  train_on_demos(program, None, task=task, tokenizer=tok, end_of_turn_id=eot, sft=sft, seed=0, rollout=rollout)
  trajs = [t for batch in program.batches for t in batch]
  assert len(trajs) == 10 and len({t.row["answer"] for t in trajs}) > 1
  for t in trajs:
    assert t.row["answer"] in tok.decode(np.asarray(t.token_ids)[np.asarray(t.action_mask)])

  def broken(text, use_tool, rng, row=None):
    raise ValueError("no demo for this row")

  broken_task = types.SimpleNamespace(scripted_response=broken, make_rows=task.make_rows)
  with pytest.raises(RuntimeError, match="SFT step 0: every demonstration chain failed.*no demo for this row"):
    train_on_demos(
      _RecordingProgram(), None, task=broken_task, tokenizer=tok, end_of_turn_id=eot, sft=sft, seed=0, rollout=rollout
    )
