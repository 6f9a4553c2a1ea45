"""Logit parity with HF transformers (torch, CPU) on the same safetensors files, and round trips.

The reference is HF's own Qwen2/Qwen3/Llama model, random-initialised (all weights, incl. norm
scales and biases, perturbed so that every name/transpose mapping matters), saved with HF's
`save_pretrained` and loaded by ours.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentfly_jax.models import CausalLM, Critic, from_pretrained, save_pretrained, to_hf_state_dict  # noqa: E402

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

_HF_CONFIGS = {
  "qwen2": transformers.Qwen2Config,
  "qwen3": transformers.Qwen3Config,
  "llama": transformers.LlamaConfig,
}
_HF_LM = {
  "qwen2": transformers.Qwen2ForCausalLM,
  "qwen3": transformers.Qwen3ForCausalLM,
  "llama": transformers.LlamaForCausalLM,
}
LLAMA3_ROPE = {
  "rope_type": "llama3",
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 64,
}

# (id, model_type, tie, extra HF config kwargs)
VARIANTS = [
  ("qwen2-tied", "qwen2", True, {}),
  ("qwen2-untied", "qwen2", False, {}),
  ("qwen3-tied", "qwen3", True, {}),
  ("qwen3-untied-bias", "qwen3", False, {"attention_bias": True}),
  ("llama-untied-llama3rope", "llama", False, {"rope_scaling": LLAMA3_ROPE, "rope_theta": 500000.0}),
  ("llama-tied-mha-bias", "llama", True, {"num_key_value_heads": 4, "attention_bias": True, "mlp_bias": True}),
]


def rel_err(ours, ref) -> float:
  ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
  return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def hf_config(model_type, tie, **extra):
  kwargs = dict(
    vocab_size=211,
    hidden_size=128,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=tie,
    rope_theta=10000.0,
  )
  kwargs.update(extra)
  cfg = _HF_CONFIGS[model_type](**kwargs)
  cfg._attn_implementation = "eager"
  return cfg


def randomize_(module: torch.nn.Module, seed: int) -> None:
  """Every parameter random (norm scales around 1, biases and weights around 0)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in module.named_parameters():
      noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
      if "norm" in name:
        p.copy_(1.0 + 0.2 * noise)
      elif "embed" in name or "lm_head" in name:
        p.copy_(0.5 * noise)
      else:
        p.copy_(0.08 * noise)


@pytest.fixture(scope="module", params=VARIANTS, ids=[v[0] for v in VARIANTS])
def hf_folder(request, tmp_path_factory):
  name, model_type, tie, extra = request.param
  torch.manual_seed(0)
  hf = _HF_LM[model_type](hf_config(model_type, tie, **extra)).eval()
  randomize_(hf, seed=len(name))
  if tie:
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
  folder = tmp_path_factory.mktemp(name)
  hf.save_pretrained(folder)
  return str(folder), hf


def hf_logits(hf, ids, mask=None, positions=None):
  with torch.no_grad():
    out = hf(
      input_ids=torch.as_tensor(np.asarray(ids), dtype=torch.long),
      attention_mask=None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.long),
      position_ids=None if positions is None else torch.as_tensor(np.asarray(positions), dtype=torch.long),
    )
  return out.logits.float().numpy()


def left_padded_batch(rng, vocab, lengths, total):
  ids = np.zeros((len(lengths), total), np.int32)
  mask = np.zeros((len(lengths), total), bool)
  for b, n in enumerate(lengths):
    ids[b, total - n :] = rng.integers(0, vocab, n)
    mask[b, total - n :] = True
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  return ids, mask, positions


def test_logits_match_hf_fp32(hf_folder):
  folder, hf = hf_folder
  model = from_pretrained(folder)
  assert isinstance(model, CausalLM)
  rng = np.random.default_rng(1)
  ids = rng.integers(0, hf.config.vocab_size, (3, 19)).astype(np.int32)
  ours = model(jnp.asarray(ids))
  assert ours.dtype == jnp.float32 and ours.shape == (3, 19, hf.config.vocab_size)
  assert rel_err(ours, hf_logits(hf, ids)) <= 1e-4


def test_logits_match_hf_with_left_padding_and_offset_positions(hf_folder):
  folder, hf = hf_folder
  model = from_pretrained(folder)
  rng = np.random.default_rng(2)
  ids, mask, positions = left_padded_batch(rng, hf.config.vocab_size, [16, 9, 3], 16)
  positions = positions + np.array([[0], [37], [300]], np.int32)  # far positions stress RoPE scaling
  ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask), positions=jnp.asarray(positions)))
  ref = hf_logits(hf, ids, mask, positions)
  assert rel_err(ours[mask], ref[mask]) <= 1e-4
  # Default positions with a mask count only real tokens (what HF generate uses).
  ours_default = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
  ref_default = hf_logits(hf, ids, mask, np.maximum(np.cumsum(mask, 1) - 1, 0))
  assert rel_err(ours_default[mask], ref_default[mask]) <= 1e-4


def test_bf16_path_within_bf16_tolerance(hf_folder):
  folder, hf = hf_folder
  model = from_pretrained(folder, dtype="bfloat16")
  assert model.model.layers[0].self_attn.q_proj.kernel[...].dtype == jnp.bfloat16
  rng = np.random.default_rng(3)
  ids = rng.integers(0, hf.config.vocab_size, (2, 11)).astype(np.int32)
  ref32 = hf_logits(hf, ids)
  ours = model(jnp.asarray(ids))
  assert ours.dtype == jnp.float32
  hf16 = _HF_LM[hf.config.model_type].from_pretrained(folder, dtype=torch.bfloat16).eval()
  hf16.config._attn_implementation = "eager"
  err_hf16 = rel_err(hf_logits(hf16, ids), ref32)
  err_ours = rel_err(ours, ref32)
  # bf16 has 8 mantissa bits (2^-8 ~ 4e-3 per op); both implementations drift by a similar amount.
  assert err_ours <= max(3 * err_hf16, 2e-2), (err_ours, err_hf16)
  assert err_ours > 1e-6  # it really computed in bf16


def test_round_trip_ours_to_hf(hf_folder, tmp_path):
  folder, hf = hf_folder
  model = from_pretrained(folder)
  out = save_pretrained(model, tmp_path / "rt", tokenizer_dir=None)
  loaded = _HF_LM[hf.config.model_type].from_pretrained(out).eval()
  loaded.config._attn_implementation = "eager"
  rng = np.random.default_rng(4)
  ids = rng.integers(0, hf.config.vocab_size, (2, 13)).astype(np.int32)
  assert rel_err(hf_logits(loaded, ids), hf_logits(hf, ids)) <= 1e-6
  # Tensor-by-tensor equality with HF's own state dict (names, layouts).
  ours_sd = to_hf_state_dict(model, model.config)
  hf_sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  if model.config.tie_word_embeddings:
    hf_sd.pop("lm_head.weight")
  assert sorted(ours_sd) == sorted(hf_sd)
  for k, v in hf_sd.items():
    np.testing.assert_array_equal(ours_sd[k], v, err_msg=k)


def test_sharded_save_loads_in_hf_and_ours(tmp_path):
  from flax import nnx
  from agentfly_jax.models import tiny_config

  model = CausalLM(tiny_config("qwen2", vocab_size=300, tie_word_embeddings=False), rngs=nnx.Rngs(5))
  out = save_pretrained(model, tmp_path / "sharded", max_shard_size=200_000)
  files = sorted(os.listdir(out))
  assert "model.safetensors.index.json" in files and "model.safetensors" not in files
  shards = [f for f in files if f.endswith(".safetensors")]
  assert len(shards) >= 3
  index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
  assert set(index["weight_map"].values()) == set(shards)
  ids = np.random.default_rng(6).integers(0, 300, (2, 9)).astype(np.int32)
  ref = np.asarray(model(jnp.asarray(ids)))
  hf = transformers.Qwen2ForCausalLM.from_pretrained(out).eval()
  assert rel_err(hf_logits(hf, ids), ref) <= 1e-4
  assert rel_err(from_pretrained(out)(jnp.asarray(ids)), ref) == 0.0


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "llama"])
def test_critic_matches_hf_token_classification(model_type, tmp_path):
  """Critic saved by us == HF *ForTokenClassification(num_labels=1) on the same files; and
  loading that folder back as a critic gives the same values."""
  from flax import nnx
  from agentfly_jax.models import tiny_config

  critic = Critic(tiny_config(model_type, vocab_size=128), rngs=nnx.Rngs(7))
  critic.score.bias[...] = jnp.asarray([0.3])
  out = save_pretrained(critic, tmp_path / "critic")
  hf_cls = getattr(
    transformers, {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}[model_type] + "ForTokenClassification"
  )
  hf = hf_cls.from_pretrained(out).eval()
  ids = np.random.default_rng(8).integers(0, 128, (2, 10)).astype(np.int32)
  with torch.no_grad():
    ref = hf(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits[..., 0].numpy()
  ours = critic(jnp.asarray(ids))
  assert ours.shape == (2, 10) and ours.dtype == jnp.float32
  assert rel_err(ours, ref) <= 1e-4
  again = from_pretrained(out, critic=True)
  np.testing.assert_array_equal(np.asarray(again(jnp.asarray(ids))), np.asarray(ours))


def test_critic_from_causal_lm_folder_warm_starts_trunk(hf_folder):
  folder, hf = hf_folder
  critic = from_pretrained(folder, critic=True, seed=3)
  lm = from_pretrained(folder)
  ids = jnp.asarray(np.random.default_rng(9).integers(0, hf.config.vocab_size, (2, 8)), jnp.int32)
  h_critic, _ = critic.hidden_states(ids)
  h_lm, _ = lm.hidden_states(ids)
  np.testing.assert_array_equal(np.asarray(h_critic), np.asarray(h_lm))
  values = critic(ids)
  np.testing.assert_allclose(
    np.asarray(values),
    np.asarray(h_lm @ critic.score.kernel[...] + critic.score.bias[...])[..., 0],
    rtol=1e-5,
    atol=1e-6,
  )
  with torch.no_grad():
    hs = hf(input_ids=torch.as_tensor(np.asarray(ids), dtype=torch.long), output_hidden_states=True).hidden_states[-1]
  assert rel_err(h_lm, hs.numpy()) <= 1e-4


def test_bf16_checkpoint_loads_as_float32(tmp_path):
  """A bf16 safetensors checkpoint (HF saves its dtype) loads into float32 params by default and
  matches HF's float32 model with the same (bf16-rounded) weights."""
  torch.manual_seed(1)
  hf = transformers.Qwen2ForCausalLM(hf_config("qwen2", False)).eval()
  randomize_(hf, seed=11)
  hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
  hf32 = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32).eval()
  hf32.config._attn_implementation = "eager"
  model = from_pretrained(tmp_path / "bf16")
  assert model.model.embed_tokens.embedding[...].dtype == jnp.float32
  ids = np.random.default_rng(12).integers(0, hf.config.vocab_size, (2, 9)).astype(np.int32)
  assert rel_err(model(jnp.asarray(ids)), hf_logits(hf32, ids)) <= 1e-4
