"""The paged JAX engine serves a Qwen3-MoE policy: greedy outputs equal a plain forward-argmax loop
(the cache-free model re-run for every token), prompts of several lengths in one stream."""

import pytest
import trio

from agentfly_jax.sampling import SamplingParams
from agentfly_jax.sampling.engine import PagedJaxSampler
from sampler_testing import make_model, reference_greedy

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.mark.slow
def test_greedy_engine_output_equals_the_forward_argmax_loop():
  model = make_model("qwen3_moe", seed=5)
  assert model.config.is_moe
  engine = PagedJaxSampler(
    model,
    num_slots=2,
    max_len=64,
    page_size=4,
    prefill_tokens=16,
    prefill_chunks=(16,),
    decode_steps=2,
    decode_batches=(2,),
    attention_block_pages=2,
  )
  prompts = [[3, 17, 42, 8, 60, 11, 5], [90, 1], [7] * 13]
  params = SamplingParams(temperature=0.0, max_new_tokens=6)
  got = [None] * len(prompts)

  async def main():
    async def one(i):
      got[i] = await engine.agenerate(prompts[i], params)

    async with trio.open_nursery() as nursery:
      for i in range(len(prompts)):
        nursery.start_soon(one, i)

  trio.run(main)
  for prompt, g in zip(prompts, got):
    assert list(g.token_ids) == reference_greedy(model, prompt, 6)
  engine.close()
