"""Qwen3-30B-A3B (mixture of experts: 128 experts, 8 a token, 48 sparse layers) GRPO on the TPU
topology `v5p:2x2x2` (8 chips), experts split over the mesh's 'expert' axis (mesh.expert=4, fsdp=2:
tokens exchanged with all_to_all, models/moe.py), JAX sampler and trainer on one mesh.

  python experiments/train.py --config=configs/tpu/qwen3_30b_a3b_grpo.py:/ckpt/Qwen3-30B-A3B --workdir=gs://...
  python experiments/aot_compile.py --config=configs/tpu/qwen3_30b_a3b_grpo.py --topology=v5p:2x2x2
"""

from agentfly_jax.rl.config import tpu_grpo_config


def get_config(model_dir: str = ""):
  """`model_dir`: the text after `configs/tpu/qwen3_30b_a3b_grpo.py:` (an HF folder), or set --config.model.pretrained."""
  config = tpu_grpo_config("qwen3_30b_a3b_grpo_v5p8", "qwen3-30b-a3b", model_dir, fsdp=2)
  config.mesh.expert = 4
  return config
