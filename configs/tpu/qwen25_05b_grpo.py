"""Qwen2.5-0.5B-Instruct GRPO on the TPU topology `v5e:2x2` (4 chips of 16 GiB), JAX sampler and
trainer on one fsdp=4 mesh, rows of 1,024 tokens; the small sibling of qwen25_7b_grpo.py.

  python experiments/train.py --config=configs/tpu/qwen25_05b_grpo.py:/ckpt/Qwen2.5-0.5B-Instruct --workdir=...
  python experiments/aot_compile.py --config=configs/tpu/qwen25_05b_grpo.py --topology=v5e:2x2   # compile-only

bfloat16 compute, float32 master params, remat "full", scanned layers, activations batch-on-fsdp.
lab/results/aot_tpu.md has what XLA reports for these programs on v5e:2x2.
"""

from agentfly_jax.rl.config import tpu_grpo_config


def get_config(model_dir: str = ""):
  """`model_dir`: an HF folder (the text after `configs/tpu/qwen25_05b_grpo.py:`)."""
  return tpu_grpo_config("qwen25_05b_grpo_v5e4", "qwen2.5-0.5b", model_dir, fsdp=4, max_total_tokens=1024)
