"""Causal self-attention (no KV cache, or a prefill into an empty one: `CausalLM.hidden_states(...,
from_empty_cache=True)`, the JAX sampler's prefill) through the TPU Pallas flash-attention kernel of
`jax.experimental.pallas.ops.tpu.flash_attention` (`attention_impl="pallas"`, TPU only).

    seg = segment_ids_for(attention_mask, segment_ids)       # int32[B, T], -1 = padding
    out = pallas_causal_attention(q, k, v, seg)              # q [B, T, H, hd], k/v [B, T, KVH, hd]

Why: on TPU the kernel keeps no [T, T] scores in HBM, forward or backward (its own fused VJP),
and it is one Mosaic custom call to compile, where `flash_attention.py` (pure JAX) unrolls a
block loop of distinct shapes into the program: at Qwen2.5-7B, 2,048-token rows, the policy
step's compile for v5p:2x2x2 drops by the attention's share (lab/results/aot_tpu.md).

T is padded up to a multiple of 128 (the kernel's block granularity) in a segment of its own.
Masking as `layers.build_attention_mask` without a cache: causal, within a packed segment, real
keys only. The kernel takes that as segment ids (`segment_ids_for`: a padding slot gets -1, so
no real query reads it); a padding query reads earlier padding keys instead of none, which
changes only outputs at padding positions (never read by a real token, never in a loss).

GQA: the kv heads are repeated to the query heads before the kernel (the kernel wants equal head
counts; the gradient of the repeat sums them back). On a mesh (`sharding.activation_sharding`),
the kernel runs under `shard_map` with batch and heads split by the activation rules (act_batch,
act_heads), as a custom call cannot be partitioned by XLA. On CPU the kernel runs only in Pallas'
TPU interpret mode (`jax.experimental.pallas.tpu.force_tpu_interpret_mode()`; the tests do).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from agentfly_jax.models.sharding import active_mesh_specs

BLOCKS = (512, 256, 128)  # kernel block sizes tried, largest first; each must divide T
LANES = 128  # the kernel's blocks are multiples of this: T is padded up to one
PAD_SEGMENT = -2  # the segment id of the slots padded on (no real or padding token reads them)


def segment_ids_for(attention_mask: jax.Array | None, segment_ids: jax.Array | None, shape) -> jax.Array:
  """int32[B, T] segment ids for the kernel: the packed segment (0 when not packed), -1 where
  `attention_mask` (bool[B, T], True = real token) is False."""
  seg = jnp.zeros(shape, jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
  if attention_mask is not None:
    seg = jnp.where(attention_mask.astype(bool), seg, -1)
  return seg


def block_sizes(t: int):
  """The kernel's BlockSizes for T (a multiple of LANES): the largest of BLOCKS dividing T."""
  from jax.experimental.pallas.ops.tpu import flash_attention as fa

  if t % LANES:
    raise ValueError(f"pallas attention: length {t} is not a multiple of {LANES} (pad it first)")
  b = next(x for x in BLOCKS if t % x == 0)
  return fa.BlockSizes(
    block_q=b,
    block_k_major=b,
    block_k=b,
    block_b=1,
    block_q_major_dkv=b,
    block_k_major_dkv=b,
    block_k_dkv=b,
    block_q_dkv=b,
    block_k_major_dq=b,
    block_k_dq=b,
    block_q_dq=b,
  )


def _kernel(q, k, v, seg, *, sm_scale: float, blocks):
  from jax.experimental.pallas.ops.tpu import flash_attention as fa

  ids = fa.SegmentIds(q=seg, kv=seg)
  return fa.flash_attention(q, k, v, segment_ids=ids, causal=True, sm_scale=sm_scale, block_sizes=blocks)


def pallas_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array) -> jax.Array:
  """Causal attention within segments.

  Args:
    q: [B, T, H, hd] (RoPE applied); k, v: [B, T, KVH, hd]; H a multiple of KVH.
    seg: int32[B, T] from `segment_ids_for`.
  Returns:
    [B, T, H * hd] in q's dtype.
  """
  b, t, h, hd = q.shape
  kvh = k.shape[2]
  if h % kvh:
    raise ValueError(f"pallas attention: {h} query heads are not a multiple of {kvh} kv heads")
  pad = -t % LANES  # the kernel's blocks are multiples of LANES: pad T up, in a segment of its own

  def heads_first(x, repeats=1):  # [B, T, N, hd] -> [B, N * repeats, T + pad, hd] in q's dtype
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    return jnp.repeat(x, repeats, axis=1).astype(q.dtype)

  q, k, v = heads_first(q), heads_first(k, h // kvh), heads_first(v, h // kvh)
  seg = jnp.pad(seg, ((0, 0), (0, pad)), constant_values=PAD_SEGMENT)
  fn = lambda q, k, v, s: _kernel(q, k, v, s, sm_scale=1.0 / math.sqrt(hd), blocks=block_sizes(t + pad))
  active = active_mesh_specs((("act_batch", "act_heads", None, None), q.shape), (("act_batch", None), seg.shape))
  if active is not None:
    mesh, (qkv_spec, seg_spec) = active
    fn = jax.shard_map(
      fn, mesh=mesh, in_specs=(qkv_spec, qkv_spec, qkv_spec, seg_spec), out_specs=qkv_spec, check_vma=False
    )
  out = fn(q, k, v, seg)[:, :, :t]  # [B, H, T, hd]
  return out.transpose(0, 2, 1, 3).reshape(b, t, h * hd)
