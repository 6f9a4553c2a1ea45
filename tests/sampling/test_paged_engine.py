"""PagedJaxSampler (continuous batching over a paged KV cache): greedy and seeded outputs equal the JaxSampler's
on mixed workloads, seeds independent of slot placement, preemption and resume give the same tokens, the page
pool's invariants over 10,000 random requests, prefix reuse across turns and within a group, weight updates in
mid-stream (drain and recompute), bounded compilations, refused requests."""

import random

import numpy as np
import pytest
import trio

from agentfly_jax.sampling import JaxSampler, SamplingParams
from agentfly_jax.sampling.engine import PagedJaxSampler, PagePool
from sampler_testing import full_logits, log_softmax64, make_model, reference_greedy

# few static shapes (each one compilation): 2 prefill shapes, 1 decode batch; blocks of 2 pages (8 tokens)
ENGINE = dict(
  max_len=96,
  page_size=4,
  prefill_tokens=32,
  prefill_chunks=(8, 32),
  decode_steps=3,
  decode_batches=(4,),
  attention_block_pages=2,
)


@pytest.fixture(scope="module")
def model():
  return make_model("qwen2", seed=3)


@pytest.fixture(scope="module")
def reference(model):
  # one program: every request fits the 48-token prompt and 24-token bucket
  return JaxSampler(
    model, max_batch_size=8, max_len=96, batch_buckets=(8,), prompt_buckets=(48,), new_token_buckets=(24,)
  )


@pytest.fixture(scope="module")
def engine(model):
  return PagedJaxSampler(model, num_slots=4, **ENGINE)


def mixed_workload(seed: int, n: int, vocab: int = 96):
  """Prompts of 1-40 tokens, 1-20 new tokens, some rows with stop ids, some sampled with seeds."""
  rng = random.Random(seed)
  prompts, params = [], []
  for i in range(n):
    prompts.append([rng.randrange(vocab) for _ in range(rng.randint(1, 40))])
    stop = tuple(rng.sample(range(vocab), 3)) if i % 3 == 0 else ()
    temperature = 0.0 if i % 2 == 0 else 0.9
    params.append(
      SamplingParams(temperature=temperature, max_new_tokens=rng.randint(1, 20), stop_token_ids=stop, seed=100 + i)
    )
  return prompts, params


def test_mixed_workload_equals_the_static_sampler_through_concurrent_trio_callers(model, reference, engine):
  prompts, params = mixed_workload(0, 14)
  want = reference.generate(prompts, params)
  got = [None] * len(prompts)

  async def main():
    async def one(i):
      await trio.sleep(0.01 * (i % 5))  # arrivals spread over time: rows enter and leave mid-stream
      got[i] = await engine.agenerate(prompts[i], params[i])

    async with trio.open_nursery() as nursery:
      for i in range(len(prompts)):
        nursery.start_soon(one, i)

  trio.run(main)
  for i, (w, g) in enumerate(zip(want, got)):
    assert g.token_ids == w.token_ids, f"request {i}"
    assert g.finish_reason == w.finish_reason
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-4, atol=1e-4)
  # greedy rows against the cache-free forward pass as well, with their log-probs
  for prompt, p, g in zip(prompts, params, got):
    if p.temperature == 0 and g.finish_reason == "length":
      assert g.token_ids == reference_greedy(model, prompt, len(g.token_ids))
      ref = log_softmax64(full_logits(model, prompt + g.token_ids))
      lp = [ref[len(prompt) - 1 + i, t] for i, t in enumerate(g.token_ids)]
      np.testing.assert_allclose(g.logprobs, lp, rtol=1e-4, atol=1e-4)
  engine.engine.wait_idle()
  engine.engine.pool.check()
  assert engine.engine.pool.in_use() == 0


def test_seeded_sampling_is_independent_of_slot_placement(model, engine):
  prompts, _ = mixed_workload(1, 8)
  params = [SamplingParams(temperature=1.0, max_new_tokens=12, seed=7 + i) for i in range(8)]
  first = engine.generate(prompts, params)
  other = PagedJaxSampler(model, num_slots=3, **{**ENGINE, "decode_steps": 2, "decode_batches": (3,)})
  order = list(reversed(range(8)))
  second = other.generate([prompts[i] for i in order], [params[i] for i in order])
  for j, i in enumerate(order):
    assert second[j].token_ids == first[i].token_ids
  assert len({t for r in first for t in r.token_ids}) > 8  # really sampled


def test_preemption_and_resume_give_the_same_tokens(model, engine):
  prompts, params = mixed_workload(2, 10)
  params = [SamplingParams(temperature=p.temperature, max_new_tokens=24, seed=p.seed) for p in params]
  want = engine.generate(prompts, params)
  # 20 usable pages of 4 tokens for 4 slots of up to 64 tokens: rows must be preempted and recomputed
  small = PagedJaxSampler(model, num_slots=4, kv_cache_pages=21, **ENGINE)
  got = small.generate(prompts, params)
  assert small.metrics()["sampler/preemptions"] > 0
  for w, g in zip(want, got):
    assert g.token_ids == w.token_ids
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-4, atol=1e-4)
  small.engine.wait_idle()
  small.engine.pool.check()
  assert small.engine.pool.in_use() == 0


def test_decode_layers_scanned_twin_decodes_as_the_policys_own_layers(model, engine):
  from flax import nnx

  from agentfly_jax.models import cpu_kernels
  from agentfly_jax.models.lora import LoRAConfig, apply_lora

  own = PagedJaxSampler(model, num_slots=4, decode_layers="model", **ENGINE)
  assert own._twin is None
  # auto stacks the layers where the decode copy is a copy anyway (the CPU kernels' "out_in" layout)
  assert (engine._twin is not None) == (cpu_kernels.decode_layout() == "out_in")
  scanned = (
    engine if engine._twin is not None else PagedJaxSampler(model, num_slots=4, decode_layers="scanned", **ENGINE)
  )
  graphdef, params = scanned._decode
  assert nnx.merge(graphdef, params).config.scan_layers and not model.config.scan_layers
  prompts, params = mixed_workload(4, 10)
  want, got = own.generate(prompts, params), scanned.generate(prompts, params)
  for w, g in zip(want, got):
    assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-5, atol=1e-5)
  # the unrolled policy's weights land in the stacked copy
  other = make_model("qwen2", seed=5)
  scanned.update_weights(nnx.state(other, nnx.Param))
  prompt = [3, 1, 4, 1, 5]
  assert scanned.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=6))[0].token_ids == (
    reference_greedy(other, prompt, 6)
  )
  scanned.update_weights(nnx.state(model, nnx.Param))
  # a LoRA policy keeps its own layout under auto, and "scanned" says why it cannot
  lora = apply_lora(make_model("qwen2", seed=3), LoRAConfig(rank=2, alpha=4.0), rngs=nnx.Rngs(1))
  assert PagedJaxSampler(lora, num_slots=2, decode_layers="auto", **ENGINE)._twin is None
  with pytest.raises(ValueError, match="decode_layers='scanned' is not possible here: .*LoRA"):
    PagedJaxSampler(lora, num_slots=2, decode_layers="scanned", **ENGINE)
  with pytest.raises(ValueError, match="decode_layers must be one of"):
    PagedJaxSampler(model, decode_layers="stacked", **ENGINE)


def test_page_pool_invariants_over_10000_random_requests():
  rng = random.Random(0)
  pool = PagePool(num_pages=257, page_size=8)
  live = []
  prefixes = [[rng.randrange(50) for _ in range(rng.randint(1, 60))] for _ in range(30)]
  for step in range(10_000):
    if live and (rng.random() < 0.5 or pool.available() < 12):
      tokens, pages, computed = live.pop(rng.randrange(len(live)))
      pool.register(tokens, pages, computed)
      pool.release(pages)
    else:
      tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 40))]
      limit = (len(tokens) - 1) // 8
      hit = pool.match(tokens, limit)
      assert len(hit) <= limit
      new = pool.allocate(pool.pages_for(len(tokens)) - len(hit))
      if new is None:
        pool.release(hit)
        continue
      live.append((tokens, hit + new, rng.randint(len(hit) * 8, len(tokens))))
    if step % 500 == 0:
      pool.check()
    if step % 2000 == 1999:
      pool.invalidate()  # a weight update while pages are in use
  for tokens, pages, computed in live:
    pool.release(pages)
  pool.check()
  assert pool.in_use() == 0 and pool.available() == pool.capacity
  assert pool.evictions > 0  # the LRU path ran
  with pytest.raises(RuntimeError, match="released more often"):
    pool.release([1])


def test_a_chains_next_turn_and_a_groups_prompt_reuse_pages(model):
  sampler = PagedJaxSampler(model, num_slots=4, **ENGINE)
  prompt = list(range(10, 33))  # 23 tokens: 5 whole pages, the last one recomputed
  greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
  first = sampler.generate([prompt], greedy)[0]
  sampler.metrics(reset=True)
  turn2 = prompt + first.token_ids + [40, 41, 42, 43, 44]
  second = sampler.generate([turn2], greedy)[0]
  m = sampler.metrics(reset=True)
  assert m["sampler/prefix_hit_tokens"] == 7 * 4  # prompt + reply (28 computed tokens) = 7 whole pages
  assert m["sampler/prefill_tokens"] == len(turn2) - 28
  assert second.token_ids == reference_greedy(model, turn2, 6)
  # a group of 4 chains on one fresh prompt: its pages are prefilled once
  group_prompt = list(range(50, 75))  # 25 tokens: 6 whole pages
  sampled = [SamplingParams(temperature=1.0, max_new_tokens=5, seed=s) for s in range(4)]
  outs = sampler.generate([group_prompt] * 4, sampled)
  m = sampler.metrics(reset=True)
  assert m["sampler/prefill_tokens"] == 25 + 3 * 1  # the first chain all 25, the others the last token only
  assert len({tuple(o.token_ids) for o in outs}) > 1


def test_weight_update_mid_stream_drain_and_recompute(model):
  old = make_model("qwen2", seed=3)
  new = make_model("qwen2", seed=4)
  import flax.nnx as nnx

  new_params = nnx.state(new, nnx.Param)
  prompt = [7, 8, 9, 10, 11]
  greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
  for mode in ("drain", "recompute"):
    sampler = PagedJaxSampler(old, num_slots=4, weight_update=mode, **{**ENGINE, "decode_steps": 1})
    got = {}

    async def main():
      async def long_request():
        got["long"] = await sampler.agenerate(prompt, greedy)

      async with trio.open_nursery() as nursery:
        nursery.start_soon(long_request)
        while sampler.engine.metrics()["sampler/decode_tokens"] < 5:
          await trio.sleep(0.005)
        sampler.update_weights(new_params)
        got["after"] = await sampler.agenerate(prompt, SamplingParams(temperature=0.0, max_new_tokens=10))

    trio.run(main)
    assert got["after"].token_ids == reference_greedy(new, prompt, 10)  # submitted after: the new weights
    assert set(got["after"].token_versions) == {1}
    long = got["long"]
    if mode == "drain":  # finished on the weights it started with
      assert long.token_ids == reference_greedy(old, prompt, 40)
      assert set(long.token_versions) == {0}
    else:  # continued on the new weights: each later token is the new model's greedy choice given the prefix
      versions = long.token_versions
      cut = versions.index(1)
      assert 5 <= cut < 40 and set(versions[cut:]) == {1} and set(versions[:cut]) == {0}
      assert long.token_ids[:cut] == reference_greedy(old, prompt, cut)
      assert long.token_ids[cut:] == reference_greedy(new, prompt + long.token_ids[:cut], 40 - cut)
    sampler.engine.pool.check()


def test_warmup_compiles_every_program_and_no_request_mix_compiles_more(model):
  # its own static sizes (page_size 2, chunks 4 / 16), so its programs are traced here, not shared with others'
  sampler = PagedJaxSampler(
    model, num_slots=4, **{**ENGINE, "page_size": 2, "prefill_chunks": (4, 16), "decode_batches": (2, 4)}
  )
  sampler.warmup()
  config = sampler.engine_config
  assert sampler.trace_count == len(config.prefill_chunks) + len(config.decode_batches)
  for seed in range(3):
    prompts, params = mixed_workload(10 + seed, 12)
    sampler.generate(prompts, params)
  assert sampler.trace_count == len(config.prefill_chunks) + len(config.decode_batches)
  assert sampler.engine.metrics()["sampler/decode_tokens"] > 0


def test_bad_requests_are_refused_clearly_and_lose_nothing(model):
  sampler = PagedJaxSampler(model, num_slots=2, kv_cache_pages=9, **ENGINE)  # 8 pages = 32 tokens
  with pytest.raises(ValueError, match=r"needs 10 pages of 4; the whole KV cache holds 8"):
    sampler.generate([[1] * 30], SamplingParams(max_new_tokens=10))
  with pytest.raises(ValueError, match="stop_width"):
    sampler.generate([[1, 2]], SamplingParams(max_new_tokens=3, stop_token_ids=tuple(range(20))))
  with pytest.raises(ValueError, match="outside the vocabulary"):
    sampler.generate([[1, 500]], SamplingParams(max_new_tokens=3))
  with pytest.raises(ValueError, match="kv_cache_pages or kv_cache_gib"):
    PagedJaxSampler(model, kv_cache_pages=10, kv_cache_gib=1.0, **ENGINE)
  with pytest.raises(ValueError, match="weight_update"):
    PagedJaxSampler(model, weight_update="sometimes", **ENGINE)
  ok = sampler.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_new_tokens=4))[0]  # still serving
  assert ok.token_ids == reference_greedy(model, [1, 2, 3], 4)


def test_a_failed_program_fails_its_requests_and_the_engine_serves_on(model):
  sampler = PagedJaxSampler(model, num_slots=2, **ENGINE)
  greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
  sampler.generate([[4, 5, 6, 7, 8, 9]], greedy)  # cached pages from before the failure
  real, calls = sampler.engine._run_prefill, []

  def flaky(*args):
    calls.append(1)
    if len(calls) == 1:
      raise RuntimeError("device lost")
    return real(*args)

  sampler.engine._run_prefill = flaky
  with pytest.raises(RuntimeError, match="device lost"):
    sampler.generate([[1, 2, 3], [3, 2, 1]], greedy)
  got = sampler.generate([[4, 5, 6, 7, 8, 9, 10]], greedy)[0]  # its old pages are gone with the cache
  assert got.token_ids == reference_greedy(model, [4, 5, 6, 7, 8, 9, 10], 5)
  sampler.engine.wait_idle()
  sampler.engine.pool.check()
  assert sampler.engine.pool.in_use() == 0


@pytest.mark.slow
@pytest.mark.eight_devices("sampler_sharding")
def test_params_sharded_on_an_8_device_mesh(eight_device_check):
  assert eight_device_check["ok"] and "PAGED_SHARDED_OK" in eight_device_check["output"], eight_device_check["output"]


def test_default_decode_batch_sizes_are_multiples_of_the_attention_row_group():
  from agentfly_jax.models.paged_attention import ROW_GROUP
  from agentfly_jax.sampling.engine.paged_sampler import decode_batch_sizes

  assert decode_batch_sizes(1) == (1,) and decode_batch_sizes(6) == (1, 2, 4, 6)
  assert decode_batch_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
  for slots in (9, 100, 256, 1000):
    sizes = decode_batch_sizes(slots)
    assert sizes[-1] == slots and list(sizes) == sorted(set(sizes))
    assert all(b % ROW_GROUP == 0 for b in sizes[3:-1])
    assert all(b <= 1.25 * a or b <= a + ROW_GROUP for a, b in zip(sizes[3:], sizes[4:]))  # padding <= 1/4
