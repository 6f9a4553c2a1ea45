"""Supervised warm start on scripted demonstrations, produced by the real rollout.

`ScriptedPolicySampler` is a Sampler whose "model" is a Python policy over the rendered prompt
text: it returns the demonstration's assistant message as token ids (+ the end-of-turn token).
Running the normal agent rollout with it yields real trajectories (same template, same tool
execution, same observation tokens, same action mask) — the SFT loss then trains on exactly the
masked-in tokens, as RL later does.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from agentfly_jax.sampling.protocol import SampleResult, SamplingParams


class ScriptedPolicySampler:
  """Sampler protocol over `policy(prompt_text, rng) -> assistant_text`."""

  def __init__(self, tokenizer, policy: Callable[[str, np.random.Generator], str], end_of_turn_id: int,
               seed: int = 0):
    self.tokenizer = tokenizer
    self.policy = policy
    self.end_of_turn_id = int(end_of_turn_id)
    self._rng = np.random.default_rng(seed)

  def _one(self, prompt: Sequence[int], params: SamplingParams) -> SampleResult:
    text = self.tokenizer.decode(list(prompt))
    rng = np.random.default_rng(params.seed) if params.seed is not None else self._rng
    ids = list(self.tokenizer.encode(self.policy(text, rng)))[: params.max_new_tokens - 1]
    ids.append(self.end_of_turn_id)
    return SampleResult(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")

  def generate(self, prompts, params):
    return [self._one(p, params) for p in prompts]

  async def agenerate(self, prompt, params):
    return self._one(prompt, params)

  def update_weights(self, params) -> None:  # a script has no weights
    return None
