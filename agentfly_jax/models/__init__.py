"""agentfly_jax.models: Flax NNX causal LMs (Qwen2/2.5, Qwen3, Llama 3), Qwen2.5-VL, a value-head critic,
HF safetensors import/export, partition rules, LoRA adapters (+ PEFT files).

    from agentfly_jax.models import from_pretrained, save_pretrained, CausalLM, tiny_config
    model = from_pretrained("hf_folder")           # model.config is its ModelConfig
    logits = model(input_ids)                      # int32[B, T] -> float32[B, T, V]
"""

from agentfly_jax.models.causal_lm import CausalLM, Critic, build_attention_mask
from agentfly_jax.models.config import ModelConfig, tiny_config
from agentfly_jax.models.gguf_convert import convert_gguf_to_hf, smollm2_folder, smollm2_gguf_path
from agentfly_jax.models.hf_io import from_pretrained, hf_name, iter_hf_tensors, save_pretrained, to_hf_state_dict
from agentfly_jax.models.kv_cache import KVCache
from agentfly_jax.models.layers import Linear, set_kernel_layout
from agentfly_jax.models.lora import LoRAConfig, apply_lora, merge_lora
from agentfly_jax.models.lora_io import export_peft, load_peft, save_merged
from agentfly_jax.models.qwen25_vl import Qwen25VL, model_class, mrope_positions
from agentfly_jax.models.vision import VisionLayout, vision_layout
from agentfly_jax.models.vision_config import VisionConfig
from agentfly_jax.models.qwen25_tokenizer import qwen25_tokenizer_folder, write_qwen25_tokenizer
from agentfly_jax.models.sharding import (
  DEFAULT_RULES,
  make_mesh,
  param_with_axes,
  partition_spec_of,
  partition_specs,
  shard_model,
  spec_for_axes,
)

__all__ = [
  "CausalLM",
  "Critic",
  "DEFAULT_RULES",
  "KVCache",
  "Linear",
  "LoRAConfig",
  "ModelConfig",
  "Qwen25VL",
  "VisionConfig",
  "VisionLayout",
  "apply_lora",
  "build_attention_mask",
  "convert_gguf_to_hf",
  "export_peft",
  "load_peft",
  "merge_lora",
  "save_merged",
  "from_pretrained",
  "hf_name",
  "iter_hf_tensors",
  "make_mesh",
  "model_class",
  "mrope_positions",
  "param_with_axes",
  "partition_spec_of",
  "partition_specs",
  "qwen25_tokenizer_folder",
  "save_pretrained",
  "set_kernel_layout",
  "shard_model",
  "smollm2_folder",
  "smollm2_gguf_path",
  "spec_for_axes",
  "tiny_config",
  "to_hf_state_dict",
  "vision_layout",
  "write_qwen25_tokenizer",
]
