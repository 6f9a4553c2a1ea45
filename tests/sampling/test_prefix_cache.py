"""The JAX sampler's multi-turn prefix cache: a chain's next turn (last prompt + reply +
observation) reuses the stored keys / values and gives the tokens and log-probs of a full
prefill (cache-free float64 reference, and a sampler without the cache on equal seeds); the
store forgets on weight updates, mixes hits and misses in one call, works with scanned layers;
PrefixStore's lookup / insert / eviction rules."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from sampler_testing import full_logits, log_softmax64, make_model, reference_greedy

from agentfly_jax.models import CausalLM, tiny_config
from agentfly_jax.sampling import JaxSampler, SamplingParams
from agentfly_jax.sampling.prefix_cache import PrefixStore

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

MAX_LEN = 256
BUCKETS = {"batch_buckets": (4,), "prompt_buckets": (16, 32, 64, 128, 256), "new_token_buckets": (16,)}


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def _cached_sampler(model):
  return JaxSampler(model, max_batch_size=4, max_len=MAX_LEN, prefix_cache_tokens=4096, **BUCKETS)


@pytest.fixture(scope="module")
def model():
  return make_model("qwen2", seed=3)


def _chains(rng, n=3, first=(40, 52, 45)):
  """Turn-1 prompts of random tokens (lengths `first`)."""
  return [rng.integers(1, 90, size=first[i]).tolist() for i in range(n)]


def _next_turn(rng, prompt, reply):
  """The next prompt: prompt + reply + a fresh observation of 5-30 tokens."""
  return prompt + reply + rng.integers(1, 90, size=int(rng.integers(5, 30))).tolist()


def _check_against_full_forward(model, prompt, res, temperature):
  ref = log_softmax64(full_logits(model, prompt + res.token_ids) / (temperature or 1.0))
  want = [ref[len(prompt) - 1 + i, t] for i, t in enumerate(res.token_ids)]
  np.testing.assert_allclose(res.logprobs, want, rtol=1e-4, atol=1e-4)


def test_greedy_turns_reuse_the_prefix_and_equal_a_full_prefill(model):
  rng = np.random.default_rng(0)
  sampler = _cached_sampler(model)
  params = SamplingParams(temperature=0.0, max_new_tokens=10)
  prompts = _chains(rng)
  last_prompts, last_results = [], []
  for turn in range(3):
    before = dataclasses.replace(sampler.prefix_store.stats)
    results = sampler.generate(prompts, params)
    stats = sampler.prefix_store.stats
    for prompt, res in zip(prompts, results):
      assert res.token_ids == reference_greedy(model, prompt, 10)
      _check_against_full_forward(model, prompt, res, 0.0)
    prefilled = stats.prefilled_tokens - before.prefilled_tokens
    assert prefilled + stats.reused_tokens - before.reused_tokens == sum(map(len, prompts))
    if turn == 0:
      assert stats.hits == 0 and prefilled == sum(map(len, prompts))
    else:
      # every prompt hit the entry of its own last turn: only the new tokens were prefilled
      assert stats.hits - before.hits == len(prompts)
      computed = [len(p0) + len(r.token_ids) - 1 for p0, r in zip(last_prompts, last_results)]
      assert prefilled == sum(len(p) - c for p, c in zip(prompts, computed))
    last_prompts, last_results = prompts, results
    prompts = [_next_turn(rng, p, r.token_ids) for p, r in zip(prompts, results)]
  assert len(sampler.prefix_store.entries) == len(prompts)  # one entry a chain: each turn replaced its last


@pytest.mark.parametrize("temperature", [0.8, 1.3])
def test_sampled_turns_equal_a_sampler_without_the_cache(model, temperature):
  rng = np.random.default_rng(1)
  cached = _cached_sampler(model)
  plain = JaxSampler(model, max_batch_size=4, max_len=MAX_LEN, **BUCKETS)
  prompts = _chains(rng)
  for turn in range(3):
    params = [SamplingParams(temperature=temperature, max_new_tokens=12, seed=100 * turn + i) for i in range(3)]
    got, want = cached.generate(prompts, params), plain.generate(prompts, params)
    for prompt, g, w in zip(prompts, got, want):
      assert g.token_ids == w.token_ids
      np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-4, atol=1e-4)
      _check_against_full_forward(model, prompt, g, temperature)
    prompts = [_next_turn(rng, p, r.token_ids) for p, r in zip(prompts, got)]
  assert cached.prefix_store.stats.hits == 6


def test_hits_and_misses_in_one_call_keep_their_order(model):
  rng = np.random.default_rng(2)
  sampler, params = _cached_sampler(model), GREEDY
  first = _chains(rng, n=2, first=(44, 60))
  replies = sampler.generate(first, params)
  fresh = rng.integers(1, 90, size=50).tolist()
  mixed = [_next_turn(rng, first[1], replies[1].token_ids), fresh, _next_turn(rng, first[0], replies[0].token_ids)]
  hits_before = sampler.prefix_store.stats.hits
  for prompt, res in zip(mixed, sampler.generate(mixed, params)):
    assert res.token_ids == reference_greedy(model, prompt, 8)
  assert sampler.prefix_store.stats.hits - hits_before == 2


def test_update_weights_forgets_the_old_weights_keys(model):
  rng = np.random.default_rng(3)
  sampler, params = _cached_sampler(model), GREEDY
  prompts = _chains(rng, n=2, first=(40, 48))
  replies = sampler.generate(prompts, params)
  other = make_model("qwen2", seed=4)
  sampler.update_weights(nnx.state(other, nnx.Param))
  assert sampler.prefix_store.entries == []
  nxt = [_next_turn(rng, p, r.token_ids) for p, r in zip(prompts, replies)]
  hits_before = sampler.prefix_store.stats.hits
  for prompt, res in zip(nxt, sampler.generate(nxt, params)):
    assert res.token_ids == reference_greedy(other, prompt, 8)  # the new weights' tokens, no stale keys
  assert sampler.prefix_store.stats.hits == hits_before


def test_scanned_layers_use_the_stacked_cache():
  cfg = dataclasses.replace(tiny_config("llama", vocab_size=96), scan_layers=True)
  model = CausalLM(cfg, rngs=nnx.Rngs(5))
  nnx.update(model, jax.tree.map(lambda x: x * 6.0, nnx.state(model, nnx.Param)))
  rng = np.random.default_rng(4)
  sampler, params = _cached_sampler(model), GREEDY
  prompts = _chains(rng, n=2, first=(40, 36))
  replies = sampler.generate(prompts, params)
  nxt = [_next_turn(rng, p, r.token_ids) for p, r in zip(prompts, replies)]
  for prompt, res in zip(nxt, sampler.generate(nxt, params)):
    assert res.token_ids == reference_greedy(model, prompt, 8)
  assert sampler.prefix_store.stats.hits == 2


def _entry_arrays(n):
  return np.zeros((1, 1, 2, n), np.float32), np.zeros((1, 1, n, 2), np.float32)


def test_store_lookup_insert_and_eviction():
  store = PrefixStore(max_tokens=200, min_hit=4)
  a = np.arange(1, 51, dtype=np.int32)  # 50 tokens
  store.insert(a, *_entry_arrays(50))
  assert store.lookup(list(a[:3])) is None  # shorter than min_hit
  hit = store.lookup(list(a) + [7, 8])
  assert hit.length == 50
  assert store.lookup(list(a)).length == 49  # the last prompt token is always prefilled
  assert store.lookup(list(a[:20]) + [999] * 10).length == 20  # a common start counts
  assert store.lookup([2, 1, 3, 4, 5, 6]) is None
  longer = np.concatenate([a, np.arange(100, 130, dtype=np.int32)])
  store.insert(longer, *_entry_arrays(80))
  assert [len(e) for e in store.entries] == [80]  # the entry it extends is dropped
  b = np.arange(500, 600, dtype=np.int32)
  store.insert(b, *_entry_arrays(100))
  store.lookup(list(longer) + [1])  # `longer` is now the most recently used
  c = np.arange(700, 760, dtype=np.int32)
  store.insert(c, *_entry_arrays(60))
  assert sorted(len(e) for e in store.entries) == [60, 80]  # 240 > 200: the least recently used (b) went
  assert store.stats.evicted == 1
  store.insert(np.arange(1000, 1300, dtype=np.int32), *_entry_arrays(300))  # over the budget alone: not kept
  assert store.tokens == 140
  with pytest.raises(ValueError, match="max_tokens"):
    PrefixStore(0)
  with pytest.raises(ValueError, match="prefix_cache_tokens"):
    JaxSampler(make_model("qwen2"), max_len=64, prefix_cache_tokens=-1)


def test_the_run_config_reaches_the_jax_sampler(model):
  from agentfly_jax.sampling.registry import SamplerRequest, build_sampler

  def build(tokens):
    request = SamplerRequest(
      model=model, policy=model, tokenizer=None, tokenizer_dir="", workdir="", seed=0,
      max_batch_size=4, max_len=64, dtype="float32", prefix_cache_tokens=tokens,
    )  # fmt: skip
    return build_sampler("jax_static", request).sampler  # the engine ("jax") shares whole pages instead

  assert build(0).prefix_store is None
  assert build(5000).prefix_store.max_tokens == 5000
