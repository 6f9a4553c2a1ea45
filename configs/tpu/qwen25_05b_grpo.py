"""Qwen2.5-0.5B-Instruct GRPO on the TPU topology `v5e:2x2` (4 chips of 16 GiB), JAX sampler and
trainer on one fsdp=4 mesh, rows of 1,024 tokens; the small sibling of qwen25_7b_grpo.py.

  python experiments/train.py --config=configs/tpu/qwen25_05b_grpo.py:/ckpt/Qwen2.5-0.5B-Instruct --workdir=...
  python experiments/aot_compile.py --config=configs/tpu/qwen25_05b_grpo.py --topology=v5e:2x2   # compile-only

bfloat16 compute, float32 master params, remat "full", scanned layers, activations batch-on-fsdp.
experiments/results/aot_tpu.md has what XLA reports for these programs on v5e:2x2.
"""
from agentfly_jax.rl.config import default_config


def get_config(model_dir: str = ""):
  """`model_dir`: an HF folder (the text after `configs/tpu/qwen25_05b_grpo.py:`)."""
  c = default_config()
  c.name = "qwen25_05b_grpo_v5e4"
  c.task = "arithmetic"
  c.algo = "grpo"
  c.model.pretrained = model_dir
  c.model.aot_preset = "qwen2.5-0.5b"  # experiments/aot_compile.py's model shape when there is no folder
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.scan_layers = True
  c.model.attention_chunk = 512
  c.train.remat = "full"
  c.mesh.fsdp = 4
  c.mesh.tp = 1
  c.rollout.sampler = "jax"
  c.rollout.rows_per_step = 8
  c.rollout.num_chains = 8
  c.rollout.max_turns = 2
  c.rollout.max_tokens_per_turn = 256
  c.rollout.max_total_tokens = 1024
  c.rollout.max_batch_size = 64
  c.train.steps = 200
  c.train.lr = 1e-6
  c.train.micro_batch_size = 8
  c.train.logits_chunk = 256
  c.eval.every = 20
  c.eval.num_rows = 64
  c.checkpoint.every = 20
  c.checkpoint.keep = 2
  return c
