"""Qwen3-8B GRPO on the TPU topology `v6e:2x4` (8 chips of 32 GiB; Cloud's v6e-8), JAX sampler and
trainer on one fsdp=8 mesh, rows of 2,048 tokens: configs/tpu/qwen25_7b_grpo.py with this model.

  python experiments/train.py --config=configs/tpu/qwen3_8b_grpo.py:/ckpt/Qwen3-8B --workdir=... --coordinator_address=auto
  python experiments/aot_compile.py --config=configs/tpu/qwen3_8b_grpo.py --topology=v6e:2x4   # compile-only

lab/results/aot_tpu.md has what XLA reports for its train step on v6e:2x4.
"""

from agentfly_jax.rl.config import tpu_grpo_config


def get_config(model_dir: str = ""):
  """`model_dir`: an HF folder (the text after `configs/tpu/qwen3_8b_grpo.py:`)."""
  return tpu_grpo_config("qwen3_8b_grpo_v6e8", "qwen3-8b", model_dir, fsdp=8)
