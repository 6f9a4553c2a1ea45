"""Supervised warm start on scripted demonstrations, produced by the real rollout.

`ScriptedPolicySampler` is a Sampler whose "model" is a Python policy over the rendered prompt
text: it returns the demonstration's assistant message as token ids (+ the end-of-turn token).
Running the normal agent rollout with it yields real trajectories (same template, same tool
execution, same observation tokens, same action mask) — the SFT loss then trains on exactly the
masked-in tokens, as RL later does.

A policy returns either the message text, or its pieces `[(text, learn), ...]`: pieces with
`learn=False` are generated (they are part of the conversation) but left out of the SFT loss
(`loss_mask`). The lookup demo uses this for a guessed answer word: the warm start learns the
decision to answer without the tool, but not a guess it could only memorise.
"""
from __future__ import annotations

from typing import Callable, Sequence, Union

import numpy as np

from agentfly_jax.sampling.protocol import SampleResult, SamplingParams

DemoTurn = Union[str, Sequence[tuple]]


class ScriptedPolicySampler:
  """Sampler protocol over `policy(prompt_text, rng) -> text | [(text, learn), ...]`."""

  def __init__(self, tokenizer, policy: Callable[[str, np.random.Generator], DemoTurn], end_of_turn_id: int,
               seed: int = 0):
    self.tokenizer = tokenizer
    self.policy = policy
    self.end_of_turn_id = int(end_of_turn_id)
    self._rng = np.random.default_rng(seed)
    # prompt ids + generated ids -> positions (within the generated ids) left out of the loss
    self._unlearned: dict[tuple, list[int]] = {}

  def _encode(self, turn: DemoTurn) -> tuple[list[int], list[int]]:
    """Token ids of a demo turn and the indices (into them) of its `learn=False` pieces."""
    if isinstance(turn, str):
      return list(self.tokenizer.encode(turn)), []
    ids, unlearned = [], []
    for i, piece in enumerate(turn):
      if not (isinstance(piece, (tuple, list)) and len(piece) == 2 and isinstance(piece[0], str)):
        raise TypeError(f"scripted policy: piece {i} of a demo turn must be (text, learn), got {piece!r:.80}")
      piece_ids = list(self.tokenizer.encode(piece[0]))
      if not piece[1]:
        unlearned += range(len(ids), len(ids) + len(piece_ids))
      ids += piece_ids
    return ids, unlearned

  def _one(self, prompt: Sequence[int], params: SamplingParams) -> SampleResult:
    text = self.tokenizer.decode(list(prompt))
    rng = np.random.default_rng(params.seed) if params.seed is not None else self._rng
    ids, unlearned = self._encode(self.policy(text, rng))
    ids = ids[: params.max_new_tokens - 1] + [self.end_of_turn_id]
    unlearned = [i for i in unlearned if i < len(ids) - 1]
    if unlearned:
      self._unlearned[tuple(prompt) + tuple(ids)] = unlearned
    return SampleResult(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")

  def generate(self, prompts, params):
    return [self._one(p, params) for p in prompts]

  async def agenerate(self, prompt, params):
    return self._one(prompt, params)

  def update_weights(self, params) -> None:  # a script has no weights
    return None

  def loss_mask(self, token_ids: np.ndarray, action_mask: np.ndarray) -> np.ndarray:
    """bool[T]: `action_mask` without the tokens of `learn=False` pieces this sampler produced.

    A model turn is a maximal run of `action_mask`; it is looked up by the ids up to its end
    (the rollout keeps the sampler's ids verbatim). A turn the rollout cut short keeps its mask.
    """
    token_ids = np.asarray(token_ids).reshape(-1)
    mask = np.asarray(action_mask, dtype=bool).reshape(-1).copy()
    T = mask.shape[0]
    ends = [e for e in range(1, T + 1) if mask[e - 1] and (e == T or not mask[e])]
    for e in ends:
      s = e
      while s > 0 and mask[s - 1]:
        s -= 1
      unlearned = self._unlearned.get(tuple(int(t) for t in token_ids[:e]))
      for i in unlearned or ():
        mask[s + i] = False
    return mask

  def clear(self) -> None:
    """Forgets the recorded turns (call after their loss masks were taken)."""
    self._unlearned.clear()


def sft_batch(arrays: dict, demo: ScriptedPolicySampler) -> dict:
  """The SFT step's batch from padded rollout arrays (`pad_batch` of the demo's trajectories):
  {"token_ids", "attention_mask": [B, T], "action_mask": bool[B, T] = the loss mask}."""
  loss_mask = np.stack([demo.loss_mask(ids, am) for ids, am in zip(arrays["token_ids"], arrays["action_mask"])])
  demo.clear()
  return {"token_ids": arrays["token_ids"], "attention_mask": arrays["attention_mask"], "action_mask": loss_mask}
