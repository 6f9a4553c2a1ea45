"""JAX and vLLM on one GPU: how the device memory is split between them, checked before a run.

Both live in one process. JAX takes a fixed share up front (`XLA_PYTHON_CLIENT_MEM_FRACTION`,
preallocated: XLA's allocator then never fights vLLM's for the same bytes); vLLM's engine is
given `gpu_memory_utilization`, the fraction of the *whole* device it may use for its weights,
activations and KV cache (it refuses to start when less than that is free). The two fractions
must therefore sum to less than 1, leaving room for the CUDA context and cuBLAS/NCCL workspaces.

`plan_memory_split` is pure: from the model's shape, the run's sizes and the device size it
estimates what each side needs and raises `MemorySplitError` (naming the side, both numbers and
the flags to change) when either share is too small, before anything is allocated. The
estimates are deliberately simple upper-ish bounds:

- JAX (training): params in `param_dtype` + gradients (same dtype) + AdamW moments (2 x float32)
  + a compute-dtype copy when it differs + a frozen reference copy (KL) + the critic's params and
  moments (PPO; its step runs after the policy's in the same program and reuses the policy step's
  gradient buffers: Qwen2.5-0.5B PPO on v5e:2x2 has the GRPO step's temporaries) + one decoder
  layer's gradients whole (the backward pass makes them before they are reduced into the stacked /
  split gradients) + with several micro-batches the gradient accumulator (`accumulator_parts`, by
  backend and layout) + the activations of one micro-batch (per layer 34*s*h + 5*a*s^2 bytes per row
  in 16-bit, Korthikanti et al. 2022; with remat only each layer's input is kept, plus one layer's
  full set) + the float32 logits of one chunk of tokens + a vision-language policy's tower (`vision_params`: no
  gradient or optimizer state while frozen, its unrolled blocks' weights gathered whole in param and compute dtype,
  a scanned tower's two blocks at a time, `vision_gathered_params`; one block's float32 attention scores over a
  row's patches) (the log-softmax and its gradient are fused
  into that buffer: XLA's temporaries for Qwen2.5-0.5B on v5e:2x2, 2 rows a chip x 256 tokens x
  151,936, are 0.5 GiB under a count of three; lab/results/aot_tpu.md). With
  `attention_chunk` the s^2 scores are not kept (only one chunk's, transiently). That sum is the
  estimate (`per_chip_jax_parts` 'total', set beside XLA's per-chip numbers in
  lab/results/aot_{tpu,gpu}.md, all within 15 %); the split check asks for it times
  `JAX_HEADROOM`, a margin for what the estimate misses.
- vLLM (sampling): weights in its dtype + the KV cache for `max_num_seqs` full-length sequences
  + `VLLM_OVERHEAD_BYTES` (activations of a prefill chunk, sampler buffers, CUDA graphs).
"""

from __future__ import annotations

import dataclasses

GIB = 1024**3
MAX_TOTAL_FRACTION = 0.95  # JAX + vLLM; the rest is the CUDA context, cuBLAS / NCCL workspaces
JAX_HEADROOM = 1.15  # the split check's margin on top of the estimate (fragmentation, what it misses)
# params-sized buffers XLA keeps beside the gradients while it accumulates micro-batches on a mesh
# (the running sum, the summed gradients divided by the token count, the micro-batch's gradients in
# the compute dtype), measured per backend: TPU 2 (the temporaries are 3.0-3.2x the split float32
# params on the scanned 8- to 32-chip rows of lab/results/aot_tpu.md), GPU 1.5 (2.4-2.6x on
# aot_gpu.md); unrolled layers keep more (the per-layer gradients are not written into one stacked
# buffer: TPU 4.0-4.3x on the 0.5B and 7B); XLA:GPU with unrolled layers adds each layer's gradients
# into the split sum as they come (no buffer beyond the gradients: Qwen2.5-0.5B / 1.5B / 7B, Llama-3.1-8B
# on h100:8) but, with tied embeddings, holds the table's gradient whole (its two uses summed before
# the split) beside the gathered table; one device with unrolled layers keeps nothing beyond the
# gradients either (Qwen2.5-0.5B on h100:1)
ACCUMULATOR_BUFFERS = {"tpu": 2.0, "gpu": 1.5}
UNROLLED_ACCUMULATOR_BUFFERS = {"tpu": 3.0, "gpu": 0.0}
VLLM_OVERHEAD_BYTES = 1 * GIB  # vLLM beyond weights + KV: prefill activations, sampler, CUDA graphs
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class MemorySplitError(ValueError):
  """The JAX / vLLM memory split cannot hold the run (the message says which side and what to change)."""


@dataclasses.dataclass(frozen=True)
class ModelShape:
  """What the estimate needs of a causal LM (HF names)."""

  num_params: int
  num_layers: int
  hidden_size: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  vocab_size: int
  layer_params: int = 0  # params of one decoder layer (0: num_params / num_layers); scanned layers need it
  tied_embeddings: bool = False  # the output projection is the embedding table
  layer_expert_params: int = 0  # of layer_params, a mixture of experts' expert kernels (split over mesh.expert)
  vision_params: int = 0  # of num_params, a vision tower's (Qwen2.5-VL `visual`)
  vision_depth: int = 0  # its blocks
  vision_block_params: int = 0  # of vision_params, one block's (0: not known, the tower gathered whole)
  vision_heads: int = 0  # its attention heads


@dataclasses.dataclass(frozen=True)
class RunSizes:
  """The run's sizes and numerics.

  micro_batch: rows per micro-batch; micro_batches: micro-batches accumulated into one update;
  seq_len: tokens per training row; logits_chunk: tokens per log-prob chunk (0 = the whole row);
  max_num_seqs / max_model_len: vLLM's batch and context; backend: "gpu" or "tpu" (XLA's buffers for
  the gradient accumulation differ, `ACCUMULATOR_BUFFERS`).
  """

  micro_batch: int
  seq_len: int
  logits_chunk: int = 256
  attention_chunk: int = 0
  fused_attention: bool = False  # a fused kernel (attention_impl "pallas"): no scores in HBM at all
  remat: bool = False
  compute_dtype: str = "bfloat16"
  param_dtype: str = "float32"
  reference_copy: bool = False
  critic: bool = False
  vllm_dtype: str = "bfloat16"
  max_num_seqs: int = 64
  max_model_len: int = 2048
  scan_layers: bool = False  # per-layer compute-dtype casts inside the layer loop (models/causal_lm.py)
  micro_batches: int = 1
  backend: str = "gpu"
  vision_patches: int = 0  # a vision-language policy's image patches a row (padded)
  vision_train: bool = False  # its tower trained (model.vision.train), else frozen

  def __post_init__(self):
    if self.backend not in ACCUMULATOR_BUFFERS:
      raise ValueError(f"memory plan: unknown backend {self.backend!r}; known: {sorted(ACCUMULATOR_BUFFERS)}")


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes: what each side is estimated to need and what its fraction gives it."""

  device_bytes: int
  jax_fraction: float
  vllm_fraction: float
  jax_need: int
  vllm_need: int
  jax_parts: dict
  vllm_parts: dict

  @property
  def jax_budget(self) -> int:
    return int(self.jax_fraction * self.device_bytes)

  @property
  def vllm_budget(self) -> int:
    return int(self.vllm_fraction * self.device_bytes)

  def describe(self) -> str:
    def parts(d):
      return ", ".join(f"{k} {v / GIB:.2f}" for k, v in d.items())

    return (
      f"device {self.device_bytes / GIB:.1f} GiB: JAX {self.jax_fraction:g} = "
      f"{self.jax_budget / GIB:.1f} GiB for ~{self.jax_need / GIB:.1f} GiB ({parts(self.jax_parts)}); "
      f"vLLM {self.vllm_fraction:g} = {self.vllm_budget / GIB:.1f} GiB for ~{self.vllm_need / GIB:.1f} "
      f"GiB ({parts(self.vllm_parts)})"
    )


def _bytes(dtype: str) -> int:
  if dtype not in _DTYPE_BYTES:
    raise ValueError(f"memory plan: unknown dtype {dtype!r}; known: {sorted(_DTYPE_BYTES)}")
  return _DTYPE_BYTES[dtype]


def jax_memory_parts(m: ModelShape, r: RunSizes, *, sharded: bool = False) -> dict:
  """Bytes per item of the training side (see the module docstring), whole (before any split);
  `sharded`: the params are split over a mesh (`accumulator_parts`)."""
  p, pb, cb = m.num_params, _bytes(r.param_dtype), _bytes(r.compute_dtype)
  trained = p - (0 if r.vision_train else m.vision_params)
  parts = {"params": p * pb, "grads": trained * pb, "adam": 2 * trained * 4}
  if r.compute_dtype != r.param_dtype:
    parts["compute copy"] = p * cb
  if r.reference_copy:
    parts["reference"] = p * pb
  if r.critic:
    parts["critic"] = p * (pb + 8)
  parts.update(accumulator_parts(m, r, sharded=sharded))
  parts["layer grads"] = (m.layer_params or p // m.num_layers) * pb
  b, s, h, a = r.micro_batch, r.seq_len, m.hidden_size, m.num_heads
  scores = 5 * a * s * s  # softmax inputs / outputs / dropout mask per row, kept for the backward pass
  if r.fused_attention:  # the kernel's score blocks live in the chip's on-core memory only
    scores, transient = 0, 0
  elif r.attention_chunk:  # chunked attention keeps none of them: one chunk's at a time, transient
    scores, transient = 0, 5 * a * s * min(r.attention_chunk, s) * b * cb // 2
  else:
    transient = 0
  full_layer = (34 * s * h + scores) * b * cb // 2
  if r.remat:
    parts["activations"] = m.num_layers * b * s * h * cb + full_layer + transient
  else:
    parts["activations"] = m.num_layers * full_layer + transient
  chunk = min(r.logits_chunk, s) if r.logits_chunk else s
  parts["logits"] = b * chunk * m.vocab_size * 4
  if m.vision_params:
    parts["vision weights"] = vision_gathered_params(m, r) * (pb + cb)
    parts["vision scores"] = b * m.vision_heads * r.vision_patches**2 * 4
  return parts


def vision_gathered_params(m: ModelShape, r: RunSizes) -> int:
  """Params of the vision tower gathered at once: a scanned tower's blocks one at a time, as the LM's layers (the
  block it runs and the next, prefetched) beside its weights outside the blocks (patch embedding, merger); an
  unrolled one's all of them."""
  if not (r.scan_layers and m.vision_block_params):
    return m.vision_params
  return m.vision_params - (m.vision_depth - 2) * m.vision_block_params


def accumulator_parts(m: ModelShape, r: RunSizes, *, sharded: bool) -> dict:
  """The buffers XLA keeps for accumulating micro-batches (bytes, whole, before any split):
  "grad accumulator" (`ACCUMULATOR_BUFFERS` params-sized buffers) and, for unrolled layers on a GPU
  mesh with tied embeddings, "embedding grads" (the table's gradient whole + the gathered table);
  {} without accumulation or with unrolled layers on one device."""
  if r.micro_batches <= 1 or (not r.scan_layers and not sharded):
    return {}
  buffers = (ACCUMULATOR_BUFFERS if r.scan_layers else UNROLLED_ACCUMULATOR_BUFFERS)[r.backend]
  trained = m.num_params - (0 if r.vision_train else m.vision_params)
  parts = {"grad accumulator": buffers * trained * _bytes(r.param_dtype)} if buffers else {}
  if not r.scan_layers and r.backend == "gpu" and m.tied_embeddings:
    parts["embedding grads"] = m.vocab_size * m.hidden_size * (_bytes(r.param_dtype) + _bytes(r.compute_dtype))
  return parts


def vllm_memory_parts(m: ModelShape, r: RunSizes) -> dict:
  """Bytes per item of the sampling side (see the module docstring)."""
  vb = _bytes(r.vllm_dtype)
  kv = 2 * m.num_layers * m.num_kv_heads * m.head_dim * vb * r.max_model_len * r.max_num_seqs
  return {"weights": m.num_params * vb, "kv cache": kv, "overhead": VLLM_OVERHEAD_BYTES}


def plan_memory_split(
  device_bytes: int, jax_fraction: float, vllm_fraction: float, model: ModelShape, run: RunSizes
) -> MemoryPlan:
  """The split's plan; raises MemorySplitError when the fractions are invalid or a side does not fit.

  Args:
    device_bytes: the GPU's memory (e.g. 80 GiB for an H100).
    jax_fraction: XLA_PYTHON_CLIENT_MEM_FRACTION (JAX preallocates this share).
    vllm_fraction: vLLM's gpu_memory_utilization.
  """
  for name, f in (("gpu.jax_mem_fraction", jax_fraction), ("gpu.vllm_mem_fraction", vllm_fraction)):
    if not 0 < f < 1:
      raise MemorySplitError(f"config.{name}={f!r}: must be in (0, 1)")
  if jax_fraction + vllm_fraction > MAX_TOTAL_FRACTION:
    raise MemorySplitError(
      f"config.gpu.jax_mem_fraction={jax_fraction:g} + config.gpu.vllm_mem_fraction={vllm_fraction:g} = "
      f"{jax_fraction + vllm_fraction:g} > {MAX_TOTAL_FRACTION}: JAX and vLLM share one device and the "
      "CUDA context needs the rest; lower one of them"
    )
  jax_parts, vllm_parts = jax_memory_parts(model, run), vllm_memory_parts(model, run)
  plan = MemoryPlan(
    int(device_bytes),
    jax_fraction,
    vllm_fraction,
    int(sum(jax_parts.values()) * JAX_HEADROOM),
    int(sum(vllm_parts.values())),
    jax_parts,
    vllm_parts,
  )
  problems = []
  if plan.jax_need > plan.jax_budget:
    problems.append(
      f"JAX (training) needs ~{plan.jax_need / GIB:.1f} GiB but config.gpu.jax_mem_fraction="
      f"{jax_fraction:g} gives {plan.jax_budget / GIB:.1f} GiB: raise it to >= "
      f"{plan.jax_need / device_bytes:.2f}, or lower train.micro_batch_size / set train.remat=full"
    )
  if plan.vllm_need > plan.vllm_budget:
    problems.append(
      f"vLLM (sampling) needs ~{plan.vllm_need / GIB:.1f} GiB but config.gpu.vllm_mem_fraction="
      f"{vllm_fraction:g} gives {plan.vllm_budget / GIB:.1f} GiB: raise it to >= "
      f"{plan.vllm_need / device_bytes:.2f}, or lower rollout.max_batch_size (vLLM's max_num_seqs) / "
      "rollout.max_total_tokens"
    )
  if problems:
    raise MemorySplitError("GPU memory split does not fit: " + "; ".join(problems) + f". [{plan.describe()}]")
  return plan


# ---------------------------------------------------------------- from a run's RunSpec
def model_shape_of(spec) -> ModelShape:
  """The policy's ModelShape of `spec` (rl/spec.RunSpec): from the HF folder's config.json
  (`model.pretrained`), else the random-init config; the parameter count from an abstract model
  (nothing allocated)."""
  from flax import nnx

  from agentfly_jax.models import CausalLM, ModelConfig
  from agentfly_jax.rl.setup import model_config

  cfg = model_config(spec, spec.model.vocab_size)
  abstract = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
  leaves = [v for _, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))]
  num_params = sum(int(getattr(v, "value", v).size) for v in leaves)
  assert isinstance(cfg, ModelConfig)
  return ModelShape(
    num_params=num_params,
    num_layers=cfg.num_hidden_layers,
    hidden_size=cfg.hidden_size,
    num_heads=cfg.num_attention_heads,
    num_kv_heads=cfg.num_key_value_heads,
    head_dim=cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads,
    vocab_size=cfg.vocab_size,
    tied_embeddings=cfg.tie_word_embeddings,
  )


def run_sizes_of(spec) -> RunSizes:
  """The run's sizes on one GPU (`spec`: rl/spec.RunSpec): its micro-batch layout as the trainer
  makes it (rl/update.py)."""
  from agentfly_jax.rl.batching import minibatch_layout

  c, r = spec, spec.rollout
  seq = r.max_total_tokens + r.max_tokens_per_turn
  micro_batch, micro_batches = minibatch_layout(r, c.train)
  return RunSizes(
    micro_batch=micro_batch,
    micro_batches=micro_batches,
    seq_len=seq,
    logits_chunk=c.train.logits_chunk,
    attention_chunk=c.model.attention_chunk,
    fused_attention=c.model.attention_impl == "pallas",
    remat=bool(c.remat),
    compute_dtype=c.model.dtype,
    param_dtype=c.model.param_dtype,
    reference_copy=c.loss.kl_coef > 0,
    critic=c.algorithm.critic,
    vllm_dtype=c.rollout.vllm_dtype or c.model.dtype,
    max_num_seqs=r.max_batch_size,
    max_model_len=seq,
    scan_layers=bool(c.model.scan_layers),
  )


def cuda_device_bytes() -> int | None:
  """Total memory of CUDA device 0 (via torch, which vLLM brings; JAX's backend stays untouched so
  its preallocation fraction can still be set), or None without a CUDA device."""
  try:
    import torch
  except ImportError:
    return None
  if not torch.cuda.is_available():
    return None
  return int(torch.cuda.get_device_properties(0).total_memory)


def apply_memory_split(spec, environ=None, device_bytes: int | None = None) -> MemoryPlan | None:
  """Before JAX touches a device: sets JAX's share (`XLA_PYTHON_CLIENT_MEM_FRACTION`, preallocated)
  and checks that both sides fit (`plan_memory_split`, raises MemorySplitError). Active when
  `config.gpu.jax_mem_fraction > 0` with the vLLM sampler. The device size: `config.gpu.
  device_memory_gib` when > 0 (a stated size: the check then also runs on a CPU-only machine),
  else `device_bytes`, else the CUDA device's; None (nothing checked) without any of them."""
  import os

  g = spec.gpu
  if not g.jax_mem_fraction or spec.rollout.sampler != "vllm":
    return None
  environ = os.environ if environ is None else environ
  environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{g.jax_mem_fraction:g}"
  environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
  if g.device_memory_gib > 0:
    device_bytes = int(g.device_memory_gib * GIB)
  elif device_bytes is None:
    device_bytes = cuda_device_bytes()
  if device_bytes is None:
    return None
  return plan_memory_split(
    device_bytes,
    g.jax_mem_fraction,
    g.vllm_mem_fraction,
    model_shape_of(spec),
    run_sizes_of(spec),
  )


_STATE_PARTS = ("params", "grads", "adam", "compute copy", "reference", "critic", "grad accumulator")
_GATHERED_PARTS = ("layer grads", "embedding grads", "vision weights")  # whole over fsdp, split over tp


def per_chip_jax_parts(m: ModelShape, r: RunSizes, *, fsdp: int, tp: int = 1, expert: int = 1, rows: int = 0) -> dict:
  """`jax_memory_parts` on an (fsdp, tp) mesh (x expert: a mixture of experts' expert-parallel axis), bytes a
  chip: the params-sized parts (state, reference, critic, gradient accumulator) split over every chip,
  activations and logits over `rows` chips (default fsdp: the micro-batch's rows are split over them), one
  layer's (and the embedding's) gradients over tp only (they are gathered over fsdp) but its experts' over
  expert too (a chip gathers only its own experts), and 'total' = their sum, the estimate
  (experiments/aot_compile.py sets it beside XLA's per-chip numbers)."""
  chips = fsdp * tp * expert
  whole = jax_memory_parts(m, r, sharded=chips > 1)
  layer = m.layer_params or m.num_params // m.num_layers
  gathered = (layer - m.layer_expert_params + m.layer_expert_params / expert) / layer  # of one layer, a chip
  rows = rows or fsdp
  parts = {k: v / (chips if k in _STATE_PARTS else tp if k in _GATHERED_PARTS else rows) for k, v in whole.items()}
  parts["layer grads"] *= gathered
  if r.scan_layers and "compute copy" in parts:
    # scanned layers cast each layer's weights inside the loop: a chip holds the gathered
    # compute-dtype weights of the layer it runs and of the next (prefetched), not a cast of all
    # of them; the embedding / output projection casts stay split over the chips
    cb = _bytes(r.compute_dtype)
    parts["compute copy"] = 2 * layer * gathered * cb / tp + (m.num_params - m.num_layers * layer) * cb / chips
  parts["total"] = sum(parts.values())
  return {k: int(v) for k, v in parts.items()}
