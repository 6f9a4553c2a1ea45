"""Qwen2.5-VL-7B-Instruct GRPO on images on the TPU topology `v5p:2x2x2` (8 chips), the JAX sampler and the
trainer on one fsdp=8 mesh, rows of 2,048 tokens, the vision tower frozen (rl/config.tpu_vl_grpo_config).

  # on this CPU, nothing but compiles (jax[tpu]); each row's images: a 160x210 GUI screenshot a turn (--images)
  python experiments/aot_compile.py --config=configs/tpu/qwen25_vl_7b_grpo.py --topology=v5p:2x2x2

Numerics as configs/tpu/qwen25_7b_grpo.py. lab/results/aot_tpu.md has what XLA reports for these programs.
"""

from agentfly_jax.rl.config import tpu_vl_grpo_config


def get_config(model_dir: str = ""):
  """`model_dir`: the text after `configs/tpu/qwen25_vl_7b_grpo.py:` (an HF folder), or set
  --config.model.pretrained."""
  return tpu_vl_grpo_config("qwen25_vl_7b_grpo_v5p8", "qwen2.5-vl-7b", model_dir, fsdp=8)
