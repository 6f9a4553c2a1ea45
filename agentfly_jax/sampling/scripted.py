"""`ScriptedSampler`: a Sampler that returns scripted token ids (tests, demos, benchmarks of the
rollout without a model).

  sampler = ScriptedSampler(lambda prompt_ids: reply_ids_for(prompt_ids), delay_s=0.01)
  result = await sampler.agenerate(prompt_ids, SamplingParams(stop_token_ids=(eos,)))

The script maps a prompt (list of ids) to the full reply ids; the sampler then applies the
request's stop ids (cuts after the first one, finish_reason "stop") and `max_new_tokens`
(finish_reason "length"), like a real sampler. Log-probs are a deterministic function of the
position and token (`scripted_logprob`), distinct per position, so alignment bugs show.
A script reads token ids alone: a request's images (PromptImages) are kept in `images_seen`, one entry
per call (None: text only), for tests of what a rollout sends. With `routes=(Lm, k)` it records routes as a
mixture-of-experts sampler does (SampleResult.routed_experts: one int[Lm, k] per fed token, prompt + new - 1;
the `prompt_routes` a request brings are kept in `prompt_routes_seen`),
`scripted_routes` of the token, its position and the prompt's length, so a later turn's request gives a token
other routes than the request that first fed it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import trio

from agentfly_jax.sampling.protocol import SampleResult, SamplingParams


def scripted_logprob(prompt_length: int, index: int, token_id: int) -> float:
  """The log-prob the scripted sampler reports for reply token `index` (< 0, varies)."""
  return -0.01 - ((token_id * 7919 + (prompt_length + index) * 104729) % 1000) / 250.0


def scripted_routes(token_id: int, position: int, prompt_length: int, shape: tuple[int, int]) -> list:
  """The routes int[Lm, k] the scripted sampler records for a fed token of a request with a prompt of
  `prompt_length` ids (distinct per token, position and prompt length)."""
  lm, k = shape
  base = token_id * 31 + position * 7 + prompt_length * 13
  return [[(base + layer * k + j) % 64 for j in range(k)] for layer in range(lm)]


class ScriptedSampler:
  """Sampler protocol over a script `prompt_ids -> reply ids`.

  Args:
    script: function of the prompt ids returning the reply ids (a list of ints), or a fixed
      list of replies used in turn (call i gets replies[i % len(replies)]).
    delay_s: simulated generation time per request (trio.sleep, so concurrent requests
      overlap like a batching sampler).
    routes: (Lm, k) to record routes like a mixture-of-experts sampler (`scripted_routes`); None: none.

  Attributes:
    calls: list of (prompt ids, SampleResult) in call order.
  """

  def __init__(
    self,
    script: Callable[[list[int]], Sequence[int]] | Sequence[Sequence[int]],
    delay_s: float = 0.0,
    routes: tuple[int, int] | None = None,
  ):
    if callable(script):
      self._script = script
    else:
      replies = [list(r) for r in script]
      if not replies:
        raise ValueError("ScriptedSampler: the list of scripted replies is empty")
      self._script = lambda prompt, _r=replies: _r[len(self.calls) % len(_r)]
    self.delay_s = float(delay_s)
    self.routes = None if routes is None else (int(routes[0]), int(routes[1]))
    self.calls: list[tuple[list[int], SampleResult]] = []
    self.images_seen: list = []  # per call, the request's PromptImages or None
    self.prompt_routes_seen: list = []  # per call, the request's prompt_routes or None
    self.num_weight_updates = 0

  @property
  def replays_prompt_routes(self) -> bool:
    return self.routes is not None

  def _sample(self, prompt: Sequence[int], params: SamplingParams, images=None, prompt_routes=None) -> SampleResult:
    prompt = [int(t) for t in prompt]
    reply = [int(t) for t in self._script(list(prompt))]
    if not reply:
      raise ValueError("ScriptedSampler: the script returned an empty reply")
    stops = set(params.stop_token_ids)
    out, finish = [], "length"
    for t in reply:
      if len(out) >= params.max_new_tokens:
        break
      out.append(t)
      if t in stops:
        finish = "stop"
        break
    if finish == "length" and len(out) == len(reply) and len(out) < params.max_new_tokens:
      finish = "stop"  # the script ended: treat like an end of sequence
    logprobs = [scripted_logprob(len(prompt), i, t) for i, t in enumerate(out)]
    routed = None
    if self.routes is not None:
      fed = prompt + out[:-1]
      routed = np.array([scripted_routes(t, i, len(prompt), self.routes) for i, t in enumerate(fed)], np.int32)
    result = SampleResult(token_ids=out, logprobs=logprobs, finish_reason=finish, routed_experts=routed)
    self.calls.append((prompt, result))
    self.images_seen.append(images)
    self.prompt_routes_seen.append(prompt_routes)
    return result

  def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, images=None) -> list[SampleResult]:
    images = [None] * len(prompts) if images is None else list(images)
    if len(images) != len(prompts):
      raise ValueError(f"got {len(images)} images entries for {len(prompts)} prompts (need one per prompt, or None)")
    return [self._sample(p, params, im) for p, im in zip(prompts, images)]

  async def agenerate(
    self, prompt: Sequence[int], params: SamplingParams, images=None, prompt_routes=None
  ) -> SampleResult:
    if self.delay_s > 0:
      await trio.sleep(self.delay_s)
    return self._sample(prompt, params, images, prompt_routes)

  def update_weights(self, params: Any) -> None:
    self.num_weight_updates += 1
