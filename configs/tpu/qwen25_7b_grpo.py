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
experiments/results/aot_tpu.md has what XLA reports for these programs on v5p:2x2x2: the train step
(8 micro-batches of 8 x 2,048) peaks at 25.8 GiB a chip of the 95 (10.6 GiB state + 15.2 GiB
temporaries), so micro_batch_size could grow; the state alone would fit 4 chips (v5p:2x2x1).
"""
from agentfly_jax.rl.config import default_config


def get_config(model_dir: str = ""):
  """`model_dir`: the text after `configs/tpu/qwen25_7b_grpo.py:` (an HF folder), or set --config.model.pretrained."""
  c = default_config()
  c.name = "qwen25_7b_grpo_v5p8"
  c.task = "arithmetic"
  c.algo = "grpo"
  c.model.pretrained = model_dir
  c.model.aot_preset = "qwen2.5-7b"  # experiments/aot_compile.py's model shape when there is no folder
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.scan_layers = True
  c.model.attention_chunk = 512
  c.train.remat = "full"
  c.mesh.fsdp = 8
  c.mesh.tp = 1
  c.rollout.sampler = "jax"
  c.rollout.rows_per_step = 8
  c.rollout.num_chains = 8
  c.rollout.max_turns = 2
  c.rollout.max_tokens_per_turn = 256
  c.rollout.max_total_tokens = 2048
  c.rollout.max_batch_size = 64
  c.train.steps = 200
  c.train.lr = 1e-6
  c.train.micro_batch_size = 8
  c.train.logits_chunk = 256
  c.loss.kl_coef = 0.0
  c.eval.every = 20
  c.eval.num_rows = 64
  c.checkpoint.every = 20
  c.checkpoint.keep = 2
  return c
