"""The SFT warm start's demonstrations: a real rollout with the scripted policy, and the loss mask
that leaves `learn=False` pieces (the lookup demo's guessed word) out of the loss."""

import os

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
