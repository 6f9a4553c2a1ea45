"""Qwen2.5-VL-7B-Instruct GRPO on images (the `visual_qa` task; a GUI task's chain takes a screenshot a turn) on the
TPU topology `v5p:2x2x2` (8 chips), the JAX sampler and the trainer on one fsdp=8 mesh, rows of 2,048 tokens,
the vision tower frozen (`model.vision.train=True` trains it too).

  # on this CPU, nothing but compiles (jax[tpu]); each row's images: a 160x210 GUI screenshot a turn (--images)
  python experiments/aot_compile.py --config=configs/tpu/qwen25_vl_7b_grpo.py --topology=v5p:2x2x2

Numerics as configs/tpu/qwen25_7b_grpo.py. lab/results/aot_tpu.md has what XLA reports for these programs.
"""

from agentfly_jax.rl.config import tpu_grpo_config


def get_config(model_dir: str = ""):
  """`model_dir`: the text after `configs/tpu/qwen25_vl_7b_grpo.py:` (an HF folder), or set --config.model.pretrained."""
  c = tpu_grpo_config("qwen25_vl_7b_grpo_v5p8", "qwen2.5-vl-7b", model_dir, fsdp=8)
  c.task = "visual_qa"
  c.model.family = "qwen2_5_vl"
  c.rollout.max_turns = 5  # a GUI chain's turns: five screenshots a row
  return c
