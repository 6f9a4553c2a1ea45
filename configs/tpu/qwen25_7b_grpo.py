"""Qwen2.5-7B-Instruct GRPO on the TPU topology `v5p:2x2x2` (8 chips, one JAX device each; the
issue calls it v5p-8, Cloud's name counts TensorCores: v5p-16), JAX sampler and trainer on one
fsdp=8 mesh, rows of 2,048 tokens.

  # on every worker of the pod slice (README "Run on a TPU pod"):
  python experiments/train.py --config=configs/tpu/qwen25_7b_grpo.py:/ckpt/Qwen2.5-7B-Instruct --workdir=gs://...
  # on this CPU, nothing but compiles (jax[tpu]); the model shape from `model.aot_preset`:
  python experiments/aot_compile.py --config=configs/tpu/qwen25_7b_grpo.py --topology=v5p:2x2x2

Numerics: bfloat16 compute, float32 master params (so float32 grads and Adam moments: 12 bytes a
param, split over the 8 devices), remat "full" per decoder layer, scanned layers (compile time flat
in depth), activations constrained batch-on-fsdp (models/sharding.py act_* rules).
lab/results/aot_tpu.md has what XLA reports for these programs on v5p:2x2x2: the train step
(8 micro-batches of 8 x 2,048) peaks at 24.2 GiB a chip of the 95 (10.6 GiB state + 13.5 GiB
temporaries), so micro_batch_size could grow; the state alone would fit 4 chips (v5p:2x2x1).
"""

from agentfly_jax.rl.config import tpu_grpo_config


def get_config(model_dir: str = ""):
  """`model_dir`: the text after `configs/tpu/qwen25_7b_grpo.py:` (an HF folder), or set --config.model.pretrained."""
  return tpu_grpo_config("qwen25_7b_grpo_v5p8", "qwen2.5-7b", model_dir, fsdp=8)
