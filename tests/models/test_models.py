"""Models without torch: KV-cache decoding vs the full forward pass, remat, configs, bad folders."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from agentfly_jax.models import (
  CausalLM,
  Critic,
  KVCache,
  ModelConfig,
  from_pretrained,
  make_mesh,
  partition_specs,
  save_pretrained,
  shard_model,
  tiny_config,
)
from agentfly_jax.models.layers import apply_rope, rope_inv_freq, rope_tables

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


def _left_padded(rng, vocab, lengths, total):
  ids = np.zeros((len(lengths), total), np.int32)
  mask = np.zeros((len(lengths), total), bool)
  for b, n in enumerate(lengths):
    ids[b, total - n :] = rng.integers(0, vocab, n)
    mask[b, total - n :] = True
  return ids, mask


@nnx.jit
def _forward(model, ids, mask, positions):
  return model(ids, attention_mask=mask, positions=positions)


@nnx.jit
def _cached_step(model, ids, positions, kv_mask, cache, index):
  return model(ids, positions=positions, attention_mask=kv_mask, cache=cache, cache_index=index)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "llama"])
def test_kv_cache_decode_equals_full_forward_with_left_padding(model_type):
  cfg = tiny_config(model_type, vocab_size=97, tie_word_embeddings=model_type != "llama")
  model = CausalLM(cfg, rngs=nnx.Rngs(1))
  rng = np.random.default_rng(0)
  prompt_len, new, max_len = 8, 5, 16
  prompt, prompt_mask = _left_padded(rng, cfg.vocab_size, [5, 8, 2], prompt_len)
  cont = rng.integers(0, cfg.vocab_size, (3, new)).astype(np.int32)
  full_ids = np.concatenate([prompt, cont], axis=1)
  full_mask = np.concatenate([prompt_mask, np.ones_like(cont, bool)], axis=1)
  positions = np.maximum(np.cumsum(full_mask, 1) - 1, 0).astype(np.int32)
  full = np.asarray(_forward(model, jnp.asarray(full_ids), jnp.asarray(full_mask), jnp.asarray(positions)))

  kv_mask = np.zeros((3, max_len), bool)
  kv_mask[:, : prompt_len + new] = full_mask
  cache = model.init_cache(3, max_len)
  assert isinstance(cache, KVCache)
  kvh, hd = cfg.num_key_value_heads, cfg.head_dim
  assert cache.k[0].shape == (3 * kvh, hd, max_len) and cache.v[0].shape == (3 * kvh, max_len, hd)
  assert cache.keys(0).shape == cache.values(0).shape == (3, kvh, max_len, hd)
  assert (cache.batch_size, cache.max_len) == (3, max_len)
  # Prefill in two chunks (0..4, 4..8), then one token at a time.
  for start, stop in ((0, 4), (4, prompt_len)):
    logits, cache = _cached_step(
      model,
      jnp.asarray(full_ids[:, start:stop]),
      jnp.asarray(positions[:, start:stop]),
      jnp.asarray(kv_mask),
      cache,
      jnp.int32(start),
    )
    real = full_mask[:, start:stop]
    np.testing.assert_allclose(np.asarray(logits)[real], full[:, start:stop][real], rtol=1e-5, atol=1e-5)
  for j in range(prompt_len, prompt_len + new):
    logits, cache = _cached_step(
      model,
      jnp.asarray(full_ids[:, j : j + 1]),
      jnp.asarray(positions[:, j : j + 1]),
      jnp.asarray(kv_mask),
      cache,
      jnp.int32(j),
    )
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, j], rtol=1e-5, atol=1e-5)
  # Slots past the written ones are untouched.
  for layer_kv in (cache.keys(0), cache.values(0)):
    assert not np.any(np.asarray(layer_kv)[:, :, prompt_len + new :])
    assert np.all(np.any(np.asarray(layer_kv)[:, :, : prompt_len + new] != 0, axis=-1))  # all written
  # The cached keys are the model's own (rotated) keys: recompute layer 0's keys for the prompt.
  layer0 = model.model.layers[0]
  cos, sin = rope_tables(jnp.asarray(positions), rope_inv_freq(cfg))
  x0 = layer0.input_layernorm(model.model.embed_tokens(jnp.asarray(full_ids)))
  k0 = layer0.self_attn.k_proj(x0).reshape(3, prompt_len + new, kvh, hd)
  if layer0.self_attn.k_norm is not None:
    k0 = layer0.self_attn.k_norm(k0)
  k0 = apply_rope(k0, cos, sin).transpose(0, 2, 1, 3)
  np.testing.assert_allclose(np.asarray(cache.keys(0))[:, :, : prompt_len + new], np.asarray(k0), rtol=1e-5, atol=1e-5)


def test_kv_mask_excludes_pad_slots():
  """Garbage in masked cache slots must not change the output."""
  cfg = tiny_config("qwen2", vocab_size=64)
  model = CausalLM(cfg, rngs=nnx.Rngs(2))
  ids = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 6)), jnp.int32)
  kv_mask = jnp.asarray(np.r_[[[False] * 2 + [True] * 6] * 2])
  pos = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
  clean = model.init_cache(2, 8)
  dirty = KVCache(
    k=tuple(jnp.full_like(k, 7.0) for k in clean.k),
    v=tuple(jnp.full_like(v, -3.0) for v in clean.v),
    num_kv_heads=clean.num_kv_heads,
  )
  a, _ = _cached_step(model, ids, pos, kv_mask, clean, jnp.int32(2))
  b, _ = _cached_step(model, ids, pos, kv_mask, dirty, jnp.int32(2))
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(a), np.asarray(_forward(model, ids, None, pos)), rtol=1e-5, atol=1e-5)


def test_remat_same_logits_and_grads():
  cfg = tiny_config("qwen3", vocab_size=64)
  plain = CausalLM(cfg, rngs=nnx.Rngs(3))
  remat = CausalLM(cfg.replace(remat=True), rngs=nnx.Rngs(3))
  ids = jnp.asarray(np.random.default_rng(2).integers(0, 64, (2, 7)), jnp.int32)

  def loss(m):
    return jnp.mean(jax.nn.log_softmax(m(ids))[..., 3])

  value_and_grad = nnx.jit(nnx.value_and_grad(loss))
  (l1, g1), (l2, g2) = value_and_grad(plain), value_and_grad(remat)
  assert abs(float(l1) - float(l2)) < 1e-6
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  assert any(float(jnp.abs(a).max()) > 0 for a in jax.tree.leaves(g1))

  def grad_jaxpr(m):
    graphdef, state = nnx.split(m)
    return str(jax.make_jaxpr(jax.grad(lambda st: loss(nnx.merge(graphdef, st))))(state))

  assert "checkpoint" in grad_jaxpr(remat) or "remat" in grad_jaxpr(remat)
  assert "checkpoint" not in grad_jaxpr(plain) and "remat" not in grad_jaxpr(plain)


def test_llama3_rope_scaling_against_float64_formula():
  rs = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
  }
  cfg = tiny_config("llama", head_dim=64, rope_theta=500000.0, rope_scaling=rs)
  ours = np.asarray(rope_inv_freq(cfg), np.float64)
  base = 1.0 / (500000.0 ** (np.arange(0, 64, 2, dtype=np.float64) / 64))
  expected = []
  for f in base:
    wavelen = 2 * np.pi / f
    if wavelen < 256 / 4.0:
      expected.append(f)
    elif wavelen > 256 / 1.0:
      expected.append(f / 8.0)
    else:
      s = (256 / wavelen - 1.0) / (4.0 - 1.0)
      expected.append((1 - s) * f / 8.0 + s * f)
  np.testing.assert_allclose(ours, expected, rtol=1e-5)
  assert np.sum(np.isclose(ours, base, rtol=1e-6)) < len(base)  # scaling changed something


def test_config_hf_dict_round_trip_and_errors():
  cfg = tiny_config(
    "llama",
    vocab_size=50,
    tie_word_embeddings=False,
    attention_bias=True,
    rope_scaling={
      "rope_type": "llama3",
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64,
    },
  )
  again = ModelConfig.from_hf_dict(json.loads(json.dumps(cfg.to_hf_dict())))
  assert again == cfg and hash(again) == hash(cfg)
  with pytest.raises(ValueError, match="num_key_value_heads"):
    tiny_config("qwen2", num_key_value_heads=3)
  with pytest.raises(ValueError, match="model_type"):
    tiny_config("gpt2")
  with pytest.raises(ValueError, match="matmul_precision"):
    tiny_config("qwen2", matmul_precision="fast")
  with pytest.raises(ValueError, match="rope_type"):
    tiny_config("llama", rope_scaling={"rope_type": "yarn", "factor": 2.0})
  bf = tiny_config("qwen2", dtype="bfloat16", param_dtype="bfloat16")
  m = CausalLM(bf, rngs=nnx.Rngs(0))
  assert m.model.embed_tokens.embedding[...].dtype == jnp.bfloat16
  assert _forward(m, jnp.zeros((1, 3), jnp.int32), None, None).dtype == jnp.float32


def test_input_errors_name_the_argument():
  model = CausalLM(tiny_config("qwen2", vocab_size=32), rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="input_ids"):
    model(jnp.zeros((1, 3), jnp.float32))
  with pytest.raises(ValueError, match="cache batch size"):
    model(jnp.zeros((2, 3), jnp.int32), cache=model.init_cache(1, 8), cache_index=0)


# ---- malformed checkpoint folders -------------------------------------------------------------


@pytest.fixture()
def saved(tmp_path):
  model = CausalLM(tiny_config("qwen2", vocab_size=40, tie_word_embeddings=False), rngs=nnx.Rngs(0))
  return str(save_pretrained(model, tmp_path / "ok"))


def test_missing_folder_and_config(tmp_path, saved):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    from_pretrained(tmp_path / "nope")
  os.remove(os.path.join(saved, "config.json"))
  with pytest.raises(FileNotFoundError, match="config.json"):
    from_pretrained(saved)


def test_missing_weights_file(saved):
  os.remove(os.path.join(saved, "model.safetensors"))
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    from_pretrained(saved)


def test_missing_tensor_is_named(saved):
  path = os.path.join(saved, "model.safetensors")
  tensors = load_file(path)
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, path)
  with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
    from_pretrained(saved)


def test_wrong_shape_is_named(saved):
  path = os.path.join(saved, "model.safetensors")
  tensors = load_file(path)
  tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((32, 128), np.float32)
  save_file(tensors, path)
  with pytest.raises(ValueError, match=r"k_proj\.weight.*\(32, 128\).*\(64, 128\)"):
    from_pretrained(saved)


def test_unknown_architecture_is_named(saved):
  cfg_path = os.path.join(saved, "config.json")
  hf = json.load(open(cfg_path))
  hf.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
  json.dump(hf, open(cfg_path, "w"))
  with pytest.raises(ValueError, match=r"config\.json.*unknown architecture.*gpt2"):
    from_pretrained(saved)


def test_index_naming_missing_shard(saved):
  json.dump(
    {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}},
    open(os.path.join(saved, "model.safetensors.index.json"), "w"),
  )
  with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors"):
    from_pretrained(saved)


def test_tokenizer_files_copied_through(tmp_path, saved):
  tok = tmp_path / "tok"
  tok.mkdir()
  (tok / "tokenizer.json").write_text('{"fake": true}')
  (tok / "tokenizer_config.json").write_text("{}")
  model = from_pretrained(saved)
  out = save_pretrained(model, tmp_path / "with_tok", tokenizer_dir=tok)
  assert (tmp_path / "with_tok" / "tokenizer.json").read_text() == '{"fake": true}'
  assert os.path.isfile(os.path.join(out, "tokenizer_config.json"))


def test_from_pretrained_onto_mesh_and_shard_model(saved):
  mesh = make_mesh(1, 1)
  placed = from_pretrained(saved, mesh=mesh)
  ref = from_pretrained(saved)
  specs = partition_specs(placed, mesh)
  for (path, var), (_, spec) in zip(nnx.to_flat_state(nnx.state(placed, nnx.Param)), nnx.to_flat_state(specs)):
    assert var[...].sharding.spec == spec, path
  ids = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
  np.testing.assert_array_equal(
    np.asarray(_forward(placed, ids, None, None)), np.asarray(_forward(ref, ids, None, None))
  )
  shard_model(ref, mesh)
  critic = Critic.from_causal_lm(ref)
  assert nnx.jit(lambda c, x: c(x))(critic, ids).shape == (1, 4)
  np.testing.assert_array_equal(np.asarray(critic.hidden_states(ids)[0]), np.asarray(ref.hidden_states(ids)[0]))
  assert critic.model.layers[0].mlp.up_proj.kernel[...] is not ref.model.layers[0].mlp.up_proj.kernel[...]


_PEAK_RSS_SCRIPT = """
import resource, sys
import jax.numpy as jnp
from agentfly_jax.models import from_pretrained
jnp.ones(3).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model = from_pretrained(sys.argv[1])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("PEAK_KB", after - before)
"""


def test_streaming_load_peak_host_memory_is_about_one_copy(tmp_path):
  """Loading ~100 MB of weights raises peak RSS by about one copy (< 1.35x), not two."""
  import subprocess
  import sys

  cfg = tiny_config(
    "llama",
    vocab_size=24000,
    hidden_size=512,
    intermediate_size=1024,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    tie_word_embeddings=False,
  )
  folder = save_pretrained(CausalLM(cfg, rngs=nnx.Rngs(0)), tmp_path / "big")
  weights = os.path.getsize(os.path.join(folder, "model.safetensors"))
  assert weights > 90e6
  proc = subprocess.run(
    [sys.executable, "-c", _PEAK_RSS_SCRIPT, folder],
    capture_output=True,
    text=True,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  peak = int(proc.stdout.split("PEAK_KB")[1]) * 1024
  assert peak < 1.35 * weights, (peak / 1e6, weights / 1e6)


@pytest.mark.parametrize("use_bias", [False, True])
def test_linear_matches_nnx_linear_and_both_kernel_layouts_agree(use_bias):
  from agentfly_jax.models import Linear, set_kernel_layout

  init = nnx.initializers.normal(0.5)
  ours = Linear(
    12,
    7,
    use_bias=use_bias,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    precision="highest",
    kernel_init=init,
    rngs=nnx.Rngs(3),
  )
  ref = nnx.Linear(
    12,
    7,
    use_bias=use_bias,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    precision="highest",
    kernel_init=init,
    rngs=nnx.Rngs(3),
  )
  # Same init stream and names as nnx.Linear: random inits and checkpoints carry over.
  np.testing.assert_array_equal(np.asarray(ours.kernel[...]), np.asarray(ref.kernel[...]))
  if use_bias:
    ref.bias.set_value(jax.random.normal(jax.random.key(5), (7,)))
    ours.bias.set_value(ref.bias[...])
  assert [p for p, _ in nnx.to_flat_state(nnx.state(ours, nnx.Param))] == [
    p for p, _ in nnx.to_flat_state(nnx.state(ref, nnx.Param))
  ]
  x = jax.random.normal(jax.random.key(int(use_bias)), (2, 5, 12))
  want = np.asarray(x, np.float64) @ np.asarray(ref.kernel[...], np.float64)
  if use_bias:
    want = want + np.asarray(ref.bias[...], np.float64)
  np.testing.assert_allclose(np.asarray(ours(x)), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ref(x)), want, rtol=1e-5, atol=1e-5)
  old_kernel = ours.kernel
  set_kernel_layout(ours, "out_in")
  assert ours.kernel_layout == "out_in" and ours.kernel[...].shape == (7, 12)
  assert old_kernel[...].shape == (12, 7)  # the old Param object is left as it was
  np.testing.assert_allclose(np.asarray(ours(x)), want, rtol=1e-5, atol=1e-5)
  set_kernel_layout(ours, "in_out")
  assert ours.kernel[...].shape == (12, 7)
  np.testing.assert_allclose(np.asarray(ours(x)), want, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="kernel layout must be one of"):
    set_kernel_layout(ours, "transposed")
