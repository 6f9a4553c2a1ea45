"""Architectures of public checkpoints by name (HF `config.json` fields, no weights): for
compile-only studies (experiments/aot_compile.py `--model=qwen2.5-7b`) and memory plans.

    hf = preset_hf_config("qwen2.5-7b")             # dict, as the checkpoint's config.json
    cfg = ModelConfig.from_hf_dict(hf, dtype="bfloat16")
"""

from __future__ import annotations

_QWEN2 = dict(
  model_type="qwen2",
  hidden_act="silu",
  rms_norm_eps=1e-6,
  rope_theta=1_000_000.0,
  max_position_embeddings=32768,
  attention_bias=True,
  use_sliding_window=False,
)
_QWEN3 = dict(
  model_type="qwen3",
  hidden_act="silu",
  rms_norm_eps=1e-6,
  rope_theta=1_000_000.0,
  max_position_embeddings=40960,
  attention_bias=False,
  head_dim=128,
  use_sliding_window=False,
)

_QWEN3_MOE = dict(
  _QWEN3,
  model_type="qwen3_moe",
  vocab_size=151936,
  num_key_value_heads=4,
  num_experts_per_tok=8,
  num_experts=128,
  norm_topk_prob=True,
  decoder_sparse_step=1,
  mlp_only_layers=[],
  tie_word_embeddings=False,
)

_QWEN25_VL = dict(  # transformers 4.x layout: text fields at the top, rope_scaling names the M-RoPE sections
  _QWEN2,
  model_type="qwen2_5_vl",
  vocab_size=151936,
  max_position_embeddings=128000,
  rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
  image_token_id=151655,
  video_token_id=151656,
  vision_start_token_id=151652,
  vision_end_token_id=151653,
)
_QWEN25_VL_VISION = dict(
  depth=32,
  hidden_size=1280,
  intermediate_size=3420,
  num_heads=16,
  in_channels=3,
  patch_size=14,
  temporal_patch_size=2,
  spatial_merge_size=2,
  window_size=112,
  fullatt_block_indexes=[7, 15, 23, 31],
  tokens_per_second=2,
  hidden_act="silu",
)

PRESETS: dict[str, dict] = {
  "qwen2.5-vl-3b": dict(
    _QWEN25_VL,
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    vision_config=dict(_QWEN25_VL_VISION, out_hidden_size=2048),
  ),
  "qwen2.5-vl-7b": dict(
    _QWEN25_VL,
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    tie_word_embeddings=False,
    vision_config=dict(_QWEN25_VL_VISION, out_hidden_size=3584),
  ),
  "qwen2.5-0.5b": dict(
    _QWEN2,
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    tie_word_embeddings=True,
  ),
  "qwen2.5-1.5b": dict(
    _QWEN2,
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    tie_word_embeddings=True,
  ),
  "qwen2.5-7b": dict(
    _QWEN2,
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    tie_word_embeddings=False,
  ),
  "qwen2.5-32b": dict(
    _QWEN2,
    vocab_size=152064,
    hidden_size=5120,
    intermediate_size=27648,
    num_hidden_layers=64,
    num_attention_heads=40,
    num_key_value_heads=8,
    tie_word_embeddings=False,
  ),
  "qwen3-8b": dict(
    _QWEN3,
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    tie_word_embeddings=False,
  ),
  "qwen3-30b-a3b": dict(
    _QWEN3_MOE,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
  ),
  "qwen3-235b-a22b": dict(
    _QWEN3_MOE,
    hidden_size=4096,
    intermediate_size=12288,
    moe_intermediate_size=1536,
    num_hidden_layers=94,
    num_attention_heads=64,
  ),
  "llama3.1-8b": dict(
    model_type="llama",
    hidden_act="silu",
    rms_norm_eps=1e-5,
    rope_theta=500_000.0,
    max_position_embeddings=131072,
    attention_bias=False,
    mlp_bias=False,
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    tie_word_embeddings=False,
    rope_scaling={
      "rope_type": "llama3",
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192,
    },
  ),
}


def preset_hf_config(name: str) -> dict:
  """The HF config.json dict of preset `name` (case-insensitive); ValueError naming the known ones."""
  key = name.lower()
  if key not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)} (or a path to an HF config.json)")
  return dict(PRESETS[key])
