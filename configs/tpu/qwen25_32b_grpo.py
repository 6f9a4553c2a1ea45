"""Qwen2.5-32B-Instruct GRPO on the TPU topology `v5p:4x4x2` (32 chips of 95 GiB), JAX sampler and
trainer on one fsdp=32 mesh, rows of 2,048 tokens: configs/tpu/qwen25_7b_grpo.py with this model.

  python experiments/train.py --config=configs/tpu/qwen25_32b_grpo.py:/ckpt/Qwen2.5-32B-Instruct --workdir=... --coordinator_address=auto
  python experiments/aot_compile.py --config=configs/tpu/qwen25_32b_grpo.py --topology=v5p:4x4x2   # compile-only

lab/results/aot_tpu.md has what XLA reports for its train step on v5p:4x4x2 (measured with
micro_batch_size 8, i.e. 8 micro-batches of 32 rows, 75 % padding; 32 gives 2 of 32 rows, the same
per-chip activations since micro-batches run one at a time).
"""

from agentfly_jax.rl.config import tpu_grpo_config


def get_config(model_dir: str = ""):
  """`model_dir`: an HF folder (the text after `configs/tpu/qwen25_32b_grpo.py:`)."""
  return tpu_grpo_config(
    "qwen25_32b_grpo_v5p32",
    "qwen2.5-32b",
    model_dir,
    fsdp=32,
    # micro-batches are a multiple of fsdp rows (rl/batching.py micro_batch_layout):
    # 32 rows = one a chip; a cap of 8 would pad 64 rows to 8 x 32
    micro_batch_size=32,
  )
