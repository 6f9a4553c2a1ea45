"""JaxSampler: greedy == argmax of the full forward pass, log-probs == log-softmax at the sampling
temperature (float64 numpy reference), seeds, stop ids, buckets without recompiles, errors,
update_weights, sharded params."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentfly_jax.sampling import JaxSampler, SamplingParams
from sampler_testing import PROMPTS, full_logits, log_softmax64, make_model, reference_greedy, truncated_log_softmax64

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.fixture(scope="module")
def model():
  return make_model("qwen2", seed=1)


@pytest.fixture(scope="module")
def sampler(model):
  # Samplers of one architecture share compiled code; keeping the buckets few keeps this file fast.
  return JaxSampler(model, max_batch_size=8, max_len=64, batch_buckets=(4, 8))


@pytest.mark.parametrize("model_type, tie", [("qwen2", True), ("qwen3", False), ("llama", False)])
def test_greedy_equals_argmax_of_full_forward(model_type, tie):
  model = make_model(model_type, tie=tie, seed=7)
  sampler = JaxSampler(model, max_batch_size=4, max_len=64, batch_buckets=(4,))
  results = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=9))
  for prompt, res in zip(PROMPTS, results):
    assert res.token_ids == reference_greedy(model, prompt, 9)
    assert res.finish_reason == "length"
    # greedy log-probs are at temperature 1
    ref = log_softmax64(full_logits(model, prompt + res.token_ids))
    want = [ref[len(prompt) - 1 + i, t] for i, t in enumerate(res.token_ids)]
    np.testing.assert_allclose(res.logprobs, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
def test_sampled_logprobs_equal_log_softmax_at_temperature(model, sampler, temperature):
  params = SamplingParams(temperature=temperature, max_new_tokens=12, seed=11)
  results = sampler.generate(PROMPTS, params)
  distinct = set()
  for prompt, res in zip(PROMPTS, results):
    assert len(res.token_ids) == 12
    ref = log_softmax64(full_logits(model, prompt + res.token_ids) / temperature)
    want = [ref[len(prompt) - 1 + i, t] for i, t in enumerate(res.token_ids)]
    np.testing.assert_allclose(res.logprobs, want, rtol=1e-4, atol=1e-4)
    distinct.update(res.token_ids)
  assert len(distinct) > 5  # really sampling, not greedy


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.8), (7, 0.6)])
def test_truncated_sampling_logprobs_and_support(model, sampler, top_k, top_p):
  params = SamplingParams(temperature=0.9, top_k=top_k, top_p=top_p, max_new_tokens=10, seed=5)
  results = sampler.generate(PROMPTS, params)
  for prompt, res in zip(PROMPTS, results):
    logits = full_logits(model, prompt + res.token_ids)
    for i, tok in enumerate(res.token_ids):
      ref, keep = truncated_log_softmax64(logits[len(prompt) - 1 + i], 0.9, top_k, top_p)
      assert keep[tok], f"sampled token {tok} outside the top-k/top-p set at step {i}"
      np.testing.assert_allclose(res.logprobs[i], ref[tok], rtol=1e-4, atol=1e-4)


def test_same_seed_same_output_different_seed_different(sampler):
  p = dict(temperature=1.0, max_new_tokens=16)
  a = sampler.generate(PROMPTS, SamplingParams(seed=123, **p))
  b = sampler.generate(PROMPTS, SamplingParams(seed=123, **p))
  c = sampler.generate(PROMPTS, SamplingParams(seed=124, **p))
  assert [r.token_ids for r in a] == [r.token_ids for r in b]
  assert [r.logprobs for r in a] == [r.logprobs for r in b]
  assert [r.token_ids for r in a] != [r.token_ids for r in c]
  # a seeded row does not depend on its batch companions
  alone = sampler.generate([PROMPTS[1]], SamplingParams(seed=123, **p))[0]
  assert alone.token_ids == a[1].token_ids


def test_unseeded_runs_replay_from_the_sampler_seed(model):
  params = SamplingParams(temperature=1.0, max_new_tokens=8)
  runs = []
  for _ in range(2):
    s = JaxSampler(model, max_batch_size=4, max_len=64, batch_buckets=(4,), seed=42)
    runs.append([r.token_ids for r in s.generate(PROMPTS, params) + s.generate(PROMPTS, params)])
  assert runs[0] == runs[1]
  assert runs[0][:4] != runs[0][4:]  # successive calls draw fresh seeds


def test_stop_ids_and_per_request_max_new_tokens(model, sampler):
  greedy = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=10))
  stop_tok = greedy[0].token_ids[3]
  first = greedy[0].token_ids.index(stop_tok)
  per_request = [
    SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop_tok, 95)),
    SamplingParams(temperature=0.0, max_new_tokens=2),
    SamplingParams(temperature=0.0, max_new_tokens=10),
    SamplingParams(temperature=0.0, max_new_tokens=1),
  ]
  out = sampler.generate(PROMPTS, per_request)
  assert out[0].token_ids == greedy[0].token_ids[: first + 1] and out[0].finish_reason == "stop"
  assert len(out[0].logprobs) == first + 1
  assert out[1].token_ids == greedy[1].token_ids[:2] and out[1].finish_reason == "length"
  assert out[2].token_ids == greedy[2].token_ids
  assert out[3].token_ids == greedy[3].token_ids[:1]


def test_context_limit_caps_new_tokens(model):
  s = JaxSampler(model, max_batch_size=4, max_len=12, batch_buckets=(4,))
  res = s.generate([list(range(1, 10))], SamplingParams(temperature=0.0, max_new_tokens=50))[0]
  assert len(res.token_ids) == 3 and res.finish_reason == "length"
  assert res.token_ids == reference_greedy(model, list(range(1, 10)), 3)


def test_no_recompile_within_buckets():
  model = make_model(vocab_size=72)  # an architecture no other test compiles
  s = JaxSampler(model, max_batch_size=8, max_len=64, prompt_buckets=(8, 16, 64), new_token_buckets=(8, 64))
  s.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0, max_new_tokens=5))
  assert s.trace_count == 1
  # different prompt lengths, batch size 2 -> same buckets (batch 2, prompt 8, new 8)
  s.generate(
    [[1, 2, 3, 4, 5, 6, 7], [9]],
    SamplingParams(temperature=0.5, top_p=0.9, max_new_tokens=8, stop_token_ids=(3,), seed=1),
  )
  assert s.trace_count == 1
  s.generate([[1] * 12, [2]], SamplingParams(max_new_tokens=5))  # prompt bucket 16: one compile
  assert s.trace_count == 2


def test_more_prompts_than_max_batch_size_are_chunked(model):
  s = JaxSampler(model, max_batch_size=4, max_len=64, batch_buckets=(4,))
  prompts = PROMPTS * 2 + [[3, 4]]
  out = s.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=4))
  assert [r.token_ids for r in out] == [reference_greedy(model, p, 4) for p in prompts]


@pytest.mark.parametrize(
  "prompts, params, match",
  [
    ([[1, 2], []], SamplingParams(), r"request 1: prompt is empty"),
    ([[1] * 64], SamplingParams(), r"request 0: prompt has 64 tokens .* max_len=64"),
    ([[1, 2], [3, 500]], SamplingParams(), r"request 1: prompt token id 500 at position 1 is outside"),
    ([[1, -2]], SamplingParams(), r"request 0: prompt token id -2"),
    (["hello"], SamplingParams(), r"request 0: prompt must be a sequence of int token ids, got str"),
    ([[1.5, 2.0]], SamplingParams(), r"request 0: prompt must hold int token ids"),
    ([[1]], SamplingParams(stop_token_ids=(1000,)), r"request 0: stop_token_ids \[1000\]"),
    ([[1]], {"temperature": 1.0}, r"params must be a SamplingParams"),
    ([[1], [2]], [SamplingParams(), {"top_p": 2}], r"request 1: sampling params must be a SamplingParams"),
    ([[1], [2]], [SamplingParams()], r"got 1 SamplingParams for 2 prompts"),
  ],
)
def test_bad_requests_get_clear_errors(sampler, prompts, params, match):
  with pytest.raises(ValueError, match=match):
    sampler.generate(prompts, params)


def test_params_mutated_after_validation_are_rejected(sampler):
  bad = SamplingParams()
  object.__setattr__(bad, "top_p", 0.0)
  with pytest.raises(ValueError, match=r"request 1: bad sampling params: .*top_p"):
    sampler.generate([[1], [2]], [SamplingParams(), bad])


def test_update_weights_uses_new_params_by_reference():
  model_a, model_b = make_model(seed=1), make_model(seed=2)
  s = JaxSampler(model_a, max_batch_size=4, max_len=64, batch_buckets=(4,))
  greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
  before = [r.token_ids for r in s.generate(PROMPTS, greedy)]
  traces = s.trace_count
  new_params = nnx.state(model_b, nnx.Param)
  s.update_weights(new_params)
  assert s.params is new_params
  after = [r.token_ids for r in s.generate(PROMPTS, greedy)]
  assert after == [reference_greedy(model_b, p, 6) for p in PROMPTS]
  assert after != before
  assert s.trace_count == traces  # same shapes: no recompile
  s.update_weights(model_a)  # a module works too
  assert [r.token_ids for r in s.generate(PROMPTS, greedy)] == before


# The two architectures (and tied / untied heads) of the greedy test above: the "out_in" sampler here
# runs the programs it compiled, only the "in_out" ones are new.
@pytest.mark.parametrize("model_type, tie", [("qwen2", True), ("llama", False)])
def test_kernel_layouts_give_the_same_results(model_type, tie):
  model = make_model(model_type, tie=tie, seed=4)
  kernels_before = {p: v[...] for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  plain = JaxSampler(model, max_batch_size=4, max_len=64, batch_buckets=(4,), kernel_layout="in_out")
  auto = JaxSampler(model, max_batch_size=4, max_len=64, batch_buckets=(4,))
  assert plain.kernel_layout == "in_out"
  assert auto.kernel_layout == ("out_in" if jax.default_backend() == "cpu" else "in_out")
  fast = JaxSampler(model, max_batch_size=4, max_len=64, batch_buckets=(4,), kernel_layout="out_in")
  # The decode copy holds [out, in] kernels; the caller's model keeps its own arrays.
  decode = dict(nnx.to_flat_state(fast._decode[1]))
  q_path = ("model", "layers", 0, "self_attn", "q_proj", "kernel")
  up_path = ("model", "layers", 0, "mlp", "up_proj", "kernel")
  np.testing.assert_array_equal(np.asarray(decode[up_path][...]), np.asarray(kernels_before[up_path]).T)
  assert decode[q_path][...].shape == kernels_before[q_path].shape[::-1]
  for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    assert value[...] is kernels_before[path]
  for params in (
    SamplingParams(temperature=0.0, max_new_tokens=8),
    SamplingParams(temperature=1.0, max_new_tokens=8, seed=3),
  ):
    for a, b in zip(plain.generate(PROMPTS, params), fast.generate(PROMPTS, params)):
      assert a.token_ids == b.token_ids
      np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="kernel_layout must be 'auto' or one of"):
    JaxSampler(model, kernel_layout="kn")


def test_update_weights_rejects_a_different_model(sampler):
  other = make_model(vocab_size=80)
  with pytest.raises(ValueError, match=r"update_weights: param .*(embedding|lm_head).* shape \((80, 128|128, 80)\)"):
    sampler.update_weights(nnx.state(other, nnx.Param))
  tied = make_model(tie=True)
  with pytest.raises(ValueError, match=r"update_weights: params do not match"):
    sampler.update_weights(nnx.state(tied, nnx.Param))


@pytest.mark.slow
@pytest.mark.eight_devices("sampler_sharding")
def test_sharded_params_on_an_8_device_mesh(eight_device_check):
  assert eight_device_check["ok"] and "SHARDED_OK" in eight_device_check["output"], eight_device_check["output"]


def test_a_push_without_the_frozen_vision_tower_keeps_the_held_one():
  from agentfly_jax.models import Qwen25VL, tiny_config

  cfg = tiny_config("qwen2_5_vl", vocab_size=96, num_hidden_layers=1)
  held, trained = Qwen25VL(cfg, rngs=nnx.Rngs(0)), Qwen25VL(cfg, rngs=nnx.Rngs(1))
  s = JaxSampler(held, max_batch_size=2, max_len=32, batch_buckets=(2,), kernel_layout="in_out")
  tower = nnx.All(nnx.Param, nnx.PathContains("visual"))
  lm_only = nnx.state(trained, nnx.All(nnx.Param, nnx.Not(tower)))
  s.update_weights(lm_only)
  got = dict(nnx.to_flat_state(s.params))
  for path, value in nnx.to_flat_state(nnx.state(trained, nnx.Param)):
    want = value[...] if path[0] != "visual" else dict(nnx.to_flat_state(nnx.state(held, nnx.Param)))[path][...]
    np.testing.assert_array_equal(np.asarray(got[path][...]), np.asarray(want))
  # what is left out must be the tower alone
  no_embed = nnx.state(trained, nnx.All(nnx.Param, nnx.Not(nnx.PathContains("embed_tokens"))))
  with pytest.raises(ValueError, match=r"update_weights: params do not match"):
    s.update_weights(no_embed)
