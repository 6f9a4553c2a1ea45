"""The paged JAX engine serves a Qwen3-MoE policy: greedy outputs equal a plain forward-argmax loop
(the cache-free model re-run for every token), prompts of several lengths in one stream; the routes it
records for every token it fed the model equal the forward pass's own routing of those tokens, through
preemption (a recompute replays them) and prefix hits (read from the pages); a dense model's programs
return what they did (no routes)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import trio
from flax import nnx

from agentfly_jax.sampling import SamplingParams
from agentfly_jax.sampling.engine import PagedJaxSampler
from sampler_testing import make_model, reference_greedy

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

# 8 usable pages of 4 tokens for 2 slots of up to 19 tokens (5 pages): two long rows cannot both finish
# without one being preempted
ENGINE = dict(
  num_slots=2,
  max_len=64,
  page_size=4,
  kv_cache_pages=9,
  prefill_tokens=16,
  prefill_chunks=(16,),
  decode_steps=2,
  decode_batches=(2,),
  attention_block_pages=2,
)


@pytest.fixture(scope="module")
def model():
  model = make_model("qwen3_moe", seed=5)
  assert model.config.is_moe
  return model


@pytest.fixture(scope="module")
def engine(model):
  engine = PagedJaxSampler(model, **ENGINE)
  yield engine
  engine.close()


_ROUTES = {}


def forward_routes(model, ids, pad_to: int = 64) -> np.ndarray:
  """int[T, Lm, k]: the cache-free forward pass's own routing of `ids`, each token's experts sorted (padding
  after the last token changes nothing before it: one jitted program for every length)."""
  if id(model) not in _ROUTES:
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda state, x: nnx.merge(graphdef, state).hidden_states(x, with_router=True)[2].experts)
    _ROUTES[id(model)] = (model, fn, state)
  _, fn, state = _ROUTES[id(model)]
  padded = np.zeros((1, -(-len(ids) // pad_to) * pad_to), np.int32)
  padded[0, : len(ids)] = ids
  experts = np.asarray(fn(state, jnp.asarray(padded)))[:, 0, : len(ids)]  # [Lm, T, k]
  return np.sort(np.moveaxis(experts, 0, 1), axis=-1)


def assert_routes_are_the_forwards(model, prompt, result):
  fed = list(prompt) + list(result.token_ids[:-1])  # every token the engine fed the model
  cfg = model.config
  assert result.routed_experts.shape == (len(fed), len(cfg.moe_layers), cfg.num_experts_per_tok)
  np.testing.assert_array_equal(np.sort(result.routed_experts, axis=-1), forward_routes(model, fed))


@pytest.mark.slow
def test_greedy_engine_output_equals_the_forward_argmax_loop(model, engine):
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
    assert_routes_are_the_forwards(model, prompt, g)


@pytest.mark.slow
def test_routes_through_preemption_and_prefix_hits(model, engine):
  greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
  prompts = [[11, 4, 70, 2, 33, 9, 61, 5, 18, 27, 44, 3, 8], [50, 6, 6, 13, 80, 2, 41, 7, 9, 30, 12, 64, 1]]
  engine.metrics(reset=True)
  first = engine.generate(prompts, greedy)
  assert engine.metrics()["sampler/preemptions"] > 0  # the later row was preempted and recomputed
  for prompt, r in zip(prompts, first):
    assert r.token_ids == reference_greedy(model, prompt, 6)
    assert_routes_are_the_forwards(model, prompt, r)
  # a chain's next turn (of the row that finished last: its pages are still cached): its prompt + reply's whole
  # pages are prefix hits, their routes read from the pages
  turn2 = prompts[1] + first[1].token_ids + [21, 22, 23]
  engine.metrics(reset=True)
  second = engine.generate([turn2], greedy)[0]
  assert engine.metrics()["sampler/prefix_hit_tokens"] == 16  # 13 + 5 computed tokens: 4 whole pages
  assert second.token_ids == reference_greedy(model, turn2, 6)
  assert_routes_are_the_forwards(model, turn2, second)
  np.testing.assert_array_equal(second.routed_experts[: len(first[1].routed_experts)], first[1].routed_experts)
  engine.engine.wait_idle()
  engine.engine.pool.check()


def test_a_chains_recorded_routes_are_replayed_where_its_prefix_is_computed_again(model, engine):
  """A chain's next turn whose cached prefix was evicted computes it again: with `prompt_routes` (what its earlier
  turns recorded) those tokens route as recorded, not as the forward pass would now."""
  greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
  prompt = [12, 5, 77, 3, 40, 19, 8, 66, 2, 31, 54]
  first = engine.generate([prompt], greedy)[0]
  turn2 = prompt + first.token_ids + [21, 22]
  known = first.routed_experts  # the prompt and the reply's fed tokens
  other = (known + 1) % model.config.num_experts  # routes the forward pass did not choose

  def evicted_turn(**kw):
    with engine.engine.paused():
      engine.engine.pool.invalidate()
    return trio.run(functools.partial(engine.agenerate, turn2, greedy, **kw))

  fresh = evicted_turn()
  assert_routes_are_the_forwards(model, turn2, fresh)
  replayed = evicted_turn(prompt_routes=other)
  np.testing.assert_array_equal(np.sort(replayed.routed_experts[: len(other)], -1), np.sort(other, -1))
  assert not np.allclose(replayed.logprobs[:1], fresh.logprobs[:1], atol=1e-3)  # computed under those routes
  same = evicted_turn(prompt_routes=known)  # the recorded routes are the forward's: nothing changes
  assert same.token_ids == fresh.token_ids
  np.testing.assert_array_equal(same.routed_experts, fresh.routed_experts)
  np.testing.assert_allclose(same.logprobs, fresh.logprobs, rtol=1e-5, atol=1e-5)
  n = len(turn2)
  with pytest.raises(
    ValueError, match=rf"prompt_routes of shape \(3, 1, 2\) for a prompt of {n}: .*\[n <= {n}, 2, 2\]"
  ):
    trio.run(functools.partial(engine.agenerate, turn2, greedy, prompt_routes=known[:3, :1]))
  assert engine.replays_prompt_routes


def test_only_a_mixture_of_experts_models_programs_return_routes():
  for family, extra in (("qwen2", 0), ("qwen3_moe", 1)):
    sampler = PagedJaxSampler(make_model(family, seed=1), **{**ENGINE, "num_slots": 1, "decode_batches": (1,)})
    assert (sampler.engine.route_shape is None) == (extra == 0)
    cache = jax.eval_shape(sampler._make_cache)
    c, r, n = sampler.engine_config, 2, 8
    rows = dict(
      temperature=np.ones(r, np.float32),
      top_k=np.zeros(r, np.int32),
      top_p=np.ones(r, np.float32),
      seeds=np.zeros(r, np.uint32),
      steps=np.zeros(r, np.int32),
      block_tables=np.zeros((r, c.table_width), np.int32),
    )
    zeros = np.zeros((r, n), np.int32)
    prefill = dict(rows, tokens=zeros, positions=zeros, valid=zeros > 0, last_index=zeros[:, 0])
    if extra:
      prefill["routed"] = np.full((r, n, *sampler.engine.route_shape), -1, np.int32)
    decode = dict(rows, tokens=zeros[:, 0], positions=zeros[:, 0], live=zeros[:, 0] > 0, remaining=zeros[:, 0])
    decode["stop_ids"] = np.full((r, c.stop_width), -1, np.int32)
    out_p = jax.eval_shape(functools.partial(sampler._run_prefill, sampler._decode, a=prefill), cache)
    out_d = jax.eval_shape(functools.partial(sampler._run_decode, sampler._decode, a=decode), cache)
    assert len(out_p) == 3 + extra and len(out_d) == 5 + extra  # a dense model's outputs as they were
    if extra:
      assert out_p[3].shape == (r, n, *sampler.engine.route_shape)
      assert out_d[5].shape == (r, c.decode_steps, *sampler.engine.route_shape)
    sampler.close()
