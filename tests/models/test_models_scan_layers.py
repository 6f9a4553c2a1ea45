"""Scanned decoder layers (`ModelConfig.scan_layers`): equal to the unrolled model in logits, every
gradient, the KV-cache decode and greedy sampling, for each family; HF import/export and
checkpoints carry over between the layouts (models/layer_stack.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from agentfly_jax.checkpoint import Checkpointer
from agentfly_jax.models import CausalLM, Critic, from_pretrained, partition_specs, save_pretrained, tiny_config
from agentfly_jax.models.hf_io import to_hf_state_dict
from agentfly_jax.models.layer_stack import stack_layers, tree_layout, unstack_layers
from agentfly_jax.sampling import JaxSampler, SamplingParams

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

LLAMA3_ROPE = {
  "rope_type": "llama3",
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 64,
}
FAMILIES = {
  "qwen2_biases_tied": dict(model_type="qwen2", tie_word_embeddings=True),
  "qwen3_qk_norm_untied": dict(model_type="qwen3", tie_word_embeddings=False),
  "llama3_rope_scaling_untied": dict(
    model_type="llama", tie_word_embeddings=False, rope_scaling=LLAMA3_ROPE, attention_bias=True, mlp_bias=True
  ),
}


def _pair(family: str, seed: int, **overrides):
  """(unrolled model, scanned model with the same weights) of a random config of `family`."""
  rng = np.random.default_rng(seed)
  kw = dict(FAMILIES[family])
  cfg = tiny_config(
    kw.pop("model_type"),
    vocab_size=int(rng.integers(100, 300)),
    num_hidden_layers=2,  # a stack of layers; more only adds compile time
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    initializer_range=0.2,
    **kw,
    **overrides,
  )
  unrolled = CausalLM(cfg, rngs=nnx.Rngs(seed))
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: CausalLM(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0))))
  scanned = nnx.merge(graphdef, stack_layers(nnx.state(unrolled)))
  return unrolled, scanned


# One family runs in the fast loop, the others are marked slow (each is ~10 s of compiles here).
FAMILY_PARAMS = [f if f == "qwen2_biases_tied" else pytest.param(f, marks=pytest.mark.slow) for f in sorted(FAMILIES)]


def _ids(model, b, t, seed):
  return jax.random.randint(jax.random.key(seed), (b, t), 0, model.config.vocab_size, jnp.int32)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_scanned_equals_unrolled_logits_and_gradients(family):
  unrolled, scanned = _pair(family, seed=len(family), remat="full")
  ids = _ids(unrolled, 2, 11, 1)
  mask = jnp.ones((2, 11), bool).at[1, :3].set(False)
  weights = jax.random.normal(jax.random.key(2), (2, 11, unrolled.config.vocab_size))

  @nnx.jit
  def logits_and_grads(model):
    def loss(m):
      logits = m(ids, attention_mask=mask)
      return jnp.mean(logits * weights), logits

    return nnx.grad(loss, has_aux=True)(model)

  g_unrolled, logits_unrolled = logits_and_grads(unrolled)
  g_scanned, logits_scanned = logits_and_grads(scanned)
  np.testing.assert_allclose(logits_scanned, logits_unrolled, rtol=1e-5, atol=1e-5)
  flat_want = dict(nnx.to_flat_state(stack_layers(nnx.state(g_unrolled))))
  flat_got = dict(nnx.to_flat_state(nnx.state(g_scanned)))
  assert flat_got.keys() == flat_want.keys()
  assert any(len(v.shape) == 3 for v in flat_got.values())  # stacked kernels [L, in, out]
  for path, got in flat_got.items():
    want = np.asarray(flat_want[path][...])
    assert np.abs(want).max() > 0, path
    np.testing.assert_allclose(got[...], want, rtol=2e-4, atol=1e-6, err_msg="/".join(map(str, path)))


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_scanned_cache_decode_equals_unrolled(family):
  unrolled, scanned = _pair(family, seed=7 + len(family))
  b, p, n = 2, 6, 4
  ids = _ids(unrolled, b, p, 3)
  caches = [m.init_cache(b, p + n) for m in (unrolled, scanned)]
  assert caches[1].stacked and not caches[0].stacked and caches[1].num_layers == caches[0].num_layers
  tokens = [ids, ids]
  step_fn = nnx.jit(lambda model, x, cache, index: model(x, cache=cache, cache_index=index))
  for step in range(n):
    outs = []
    for k, model in enumerate((unrolled, scanned)):
      x = tokens[k] if step == 0 else tokens[k][:, -1:]
      logits, caches[k] = step_fn(model, x, caches[k], jnp.int32(0 if step == 0 else p + step - 1))
      outs.append(logits[:, -1])
      tokens[k] = jnp.concatenate([tokens[k], jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)], 1)
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(tokens[1], tokens[0])
  for layer in range(unrolled.config.num_hidden_layers):
    np.testing.assert_allclose(caches[1].keys(layer), caches[0].keys(layer), rtol=1e-5, atol=1e-5)


def test_cache_of_the_other_layout_is_refused():
  unrolled, scanned = _pair("qwen2_biases_tied", seed=0)
  with pytest.raises(ValueError, match="per layer but the model has scan_layers=True"):
    scanned(_ids(scanned, 1, 3, 0), cache=unrolled.init_cache(1, 8))


@pytest.mark.slow
def test_scanned_greedy_sampling_equals_unrolled():
  unrolled, scanned = _pair("qwen3_qk_norm_untied", seed=3)
  prompts = [[5, 9, 17, 3], [2, 8]]
  params = SamplingParams(temperature=0.0, max_new_tokens=6)
  got = [JaxSampler(m, max_batch_size=2, max_len=16).generate(prompts, params) for m in (unrolled, scanned)]
  assert [r.token_ids for r in got[1]] == [r.token_ids for r in got[0]]
  np.testing.assert_allclose([r.logprobs for r in got[1]], [r.logprobs for r in got[0]], atol=1e-4)


def test_scanned_params_carry_the_layers_axis():
  _, scanned = _pair("qwen2_biases_tied", seed=1)
  specs = dict(nnx.to_flat_state(partition_specs(scanned)))
  assert specs[("model", "layers", "self_attn", "q_proj", "kernel")] == P(None, "fsdp", "tp")
  assert specs[("model", "layers", "mlp", "down_proj", "kernel")] == P(None, ("tp", "fsdp"), None)
  assert specs[("model", "layers", "input_layernorm", "scale")] == P(None, None)
  assert specs[("model", "embed_tokens", "embedding")] == P("tp", "fsdp")


def test_stack_unstack_round_trip_and_errors():
  unrolled, _ = _pair("llama3_rope_scaling_untied", seed=2)
  state = nnx.state(unrolled, nnx.Param)
  stacked = stack_layers(state)
  assert tree_layout(stacked) == "scanned" and tree_layout(state) == "unrolled"
  back = unstack_layers(stacked)
  assert jax.tree.structure(back) == jax.tree.structure(state)
  for (pa, a), (pb, b) in zip(nnx.to_flat_state(back), nnx.to_flat_state(state)):
    assert pa == pb and a.get_metadata() == b.get_metadata()
    np.testing.assert_array_equal(a[...], b[...])
  flat = [(p, v) for p, v in nnx.to_flat_state(state) if p[:3] != ("model", "layers", 0)]  # layer 0 missing
  with pytest.raises(ValueError, match="has layers"):
    stack_layers(nnx.from_flat_state(flat))


@pytest.mark.parametrize("critic", [False, True])
def test_hf_round_trip_with_scan_layers(tmp_path, critic):
  unrolled, scanned = _pair("qwen2_biases_tied", seed=4)
  if critic:
    unrolled = Critic.from_causal_lm(unrolled)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Critic(scanned.config, rngs=nnx.Rngs(0))))
    scanned = nnx.merge(graphdef, stack_layers(nnx.state(unrolled)))
  want = to_hf_state_dict(unrolled)
  got = to_hf_state_dict(scanned)
  assert got.keys() == want.keys() and "model.layers.1.self_attn.q_proj.weight" in got
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  save_pretrained(scanned, tmp_path / "hf")
  loaded = from_pretrained(tmp_path / "hf", critic=critic, scan_layers=True)
  assert loaded.config.scan_layers
  for (pa, a), (pb, b) in zip(
    nnx.to_flat_state(nnx.state(loaded, nnx.Param)), nnx.to_flat_state(nnx.state(scanned, nnx.Param))
  ):
    assert pa == pb
    np.testing.assert_array_equal(a[...], b[...], err_msg="/".join(map(str, pa)))
  ids = _ids(unrolled, 2, 5, 0)
  forward = nnx.jit(lambda model: model(ids))  # one program for both (same structure), not op by op
  np.testing.assert_allclose(forward(from_pretrained(tmp_path / "hf", critic=critic)), forward(unrolled), rtol=1e-6)


_ADAM = optax.adam(1e-3)


@jax.jit
def _train_state(params):
  """{params, Adam state with non-zero moments, step}: one program per layout, not op by op."""
  opt = _ADAM.init(params)
  grads = jax.tree.map(lambda x: jax.random.normal(jax.random.key(x.size), x.shape), params)
  _, opt = _ADAM.update(grads, opt, params)
  return {"params": params, "opt": opt, "step": jnp.int32(3)}


_zero_train_state = jax.jit(lambda params: jax.tree.map(jnp.zeros_like, _train_state(params)))


@pytest.mark.slow
@pytest.mark.parametrize("saved_layout", ["unrolled", "scanned"])
def test_checkpoint_of_either_layout_restores_into_the_other(tmp_path, saved_layout):
  unrolled, scanned = _pair("qwen3_qk_norm_untied", seed=5)
  source, target_model = (unrolled, scanned) if saved_layout == "unrolled" else (scanned, unrolled)
  saved = _train_state(nnx.state(source, nnx.Param))
  ckpt = Checkpointer(str(tmp_path / "ck"), async_save=False)
  ckpt.save(3, saved, {"data_position": 7})
  ckpt.wait()
  target = _zero_train_state(nnx.state(target_model, nnx.Param))
  restored, meta = ckpt.restore(None, target)
  ckpt.close()
  assert meta == {"data_position": 7}
  assert jax.tree.structure(restored) == jax.tree.structure(target)
  want = stack_layers(saved) if saved_layout == "unrolled" else unstack_layers(saved)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("scan", [False, True])
def test_remat_layers_run_inside_prepare_lax_map(scan):
  """prepare runs the model under lax.map on a model merged outside it: the remat policy must not
  be an nnx transform of those (outer-trace) variables."""
  from agentfly_jax.rl.core.prepare import make_prepare
  from agentfly_jax.rl.update import default_prepare_config

  cfg = tiny_config("qwen2", vocab_size=64, num_hidden_layers=2, remat="full", scan_layers=scan)
  # abstract params: only the trace is checked (jax.eval_shape below), no init compiled
  graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)
  ids = jax.random.randint(jax.random.key(0), (4, 8), 0, 64, jnp.int32)
  ones = jnp.ones((4, 8), bool)
  arrays = dict(
    input_ids=ids,
    target_ids=jnp.roll(ids, -1, 1),
    attention_mask=ones,
    action_mask=ones,
    sampler_logprobs=jnp.full((4, 8), -1.0),
    rewards=jnp.arange(4.0),
    group_ids=jnp.zeros((4,), jnp.int32),
  )
  batch, _ = jax.eval_shape(
    make_prepare(graphdef, rest, default_prepare_config(estimator="grpo", chunk=2)), params, None, None, arrays
  )
  assert batch["old_logprobs"].shape == (4, 8)
