"""A judge model run in this process on its own sampler: `rewards.judge_client.JudgeClient` over any Sampler.

client = SamplerJudge(JaxSampler(judge_model, max_len=2048), judge_tokenizer_dir)
calls = JudgeCalls(client, max_concurrency=8)          # rewards/judge_client.py: the call policy
"""

from __future__ import annotations

from agentfly_jax.agents.tokenizer import load_tokenizer
from agentfly_jax.sampling.protocol import SamplingParams


class SamplerJudge:
  """A judge model run in this process on its own sampler (any `Sampler`: sampling/): the messages rendered
  with `tokenizer`'s chat template (agents.load_tokenizer), sampled up to `max_tokens` or its end-of-turn id,
  the reply decoded without special tokens (the JSON schema is not enforced here: a reply off it does not parse)."""

  def __init__(self, sampler, tokenizer, *, name: str = "in_process", temperature: float = 0.0, max_tokens: int = 256):
    self.sampler, self.tokenizer = sampler, load_tokenizer(tokenizer)
    self.temperature, self.max_tokens = temperature, max_tokens
    end = self.tokenizer.token_to_id("<|im_end|>")
    self.stop_ids = tuple(i for i in (end, self.tokenizer.eos_token_id) if i is not None)
    self.key = f"sampler:{name}:{temperature}:{max_tokens}"

  async def complete(self, messages: list[dict], schema: dict | None = None) -> str:
    ids = self.tokenizer.encode(self.tokenizer.render(messages, add_generation_prompt=True))
    params = SamplingParams(temperature=self.temperature, max_new_tokens=self.max_tokens, stop_token_ids=self.stop_ids)
    result = await self.sampler.agenerate(ids, params)
    return self.tokenizer.decode([t for t in result.token_ids if t not in self.stop_ids], skip_special_tokens=True)
