"""Decoder building blocks: RMSNorm, RoPE (incl. Llama-3 scaling), GQA attention, SwiGLU MLP.

Numerics follow HF transformers' Qwen2 / Qwen3 / Llama modules: RMSNorm in float32 then cast
back, RoPE tables in float32, softmax in float32. Parameter layouts: Linear kernels are
[in, out] (HF stores [out, in]); see `hf_io.py` for the one name/transpose table. A sampler may
hold a copy with [out, in] kernels (`set_kernel_layout`). The dense layer is one `dot_general`;
the CPU's faster kernels for it (a written-out backward, fused projections, the [out, in] decode
layout) are in models/cpu_kernels.py, behind its one switch.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from agentfly_jax.models import cpu_kernels
from agentfly_jax.models.config import ModelConfig
from agentfly_jax.models.cpu_kernels import KERNEL_LAYOUTS  # noqa: F401 (re-exported)
from agentfly_jax.models.flash_attention import _MASK_VALUE, flash_causal_attention
from agentfly_jax.models.paged_attention import PageTable, cache_heads_first, paged_attend, write_pages
from agentfly_jax.models.pallas_paged_attention import pallas_paged_decode
from agentfly_jax.models.pallas_attention import pallas_causal_attention
from agentfly_jax.models.sharding import HIDDEN_AXES, constrain, logical_axes, param_with_axes


class RMSNorm(nnx.Module):
  """y = scale * (x / sqrt(mean(x^2) + eps)), the mean in float32.  x: [..., D] -> [..., D].
  `axis`: the logical name of the scale's dim (models/sharding.py)."""

  def __init__(self, dim: int, *, eps: float, dtype, param_dtype, axis: str = "embed_vector"):
    self.eps = eps
    self.dtype = dtype
    self.scale = param_with_axes(jnp.ones((dim,), param_dtype), (axis,))

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    normed = (x32 * jax.lax.rsqrt(var + self.eps)).astype(self.dtype)
    return self.scale[...].astype(self.dtype) * normed


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
  """Inverse RoPE frequencies float32[head_dim // 2], with 'linear' / 'llama3' scaling applied."""
  hd = cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
  rope_type = cfg.rope_type
  if rope_type == "linear":
    return inv_freq / float(cfg.rope_scaling["factor"])
  if rope_type == "llama3":
    rs = cfg.rope_scaling
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_len = float(rs["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return jnp.where(is_medium, smoothed, scaled)
  return inv_freq


def rope_tables(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
  """positions int32[B, T], inv_freq f32[hd/2] -> (cos, sin) float32[B, T, hd] (halves repeated)."""
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def mrope_tables(positions: jax.Array, inv_freq: jax.Array, section: tuple) -> tuple[jax.Array, jax.Array]:
  """Multimodal RoPE (Qwen2.5-VL): positions int32[3, B, T] (temporal, height, width), inv_freq
  f32[hd/2], section (3 ints summing to hd/2) -> (cos, sin) float32[B, T, hd]. The first section[0]
  frequencies turn with the temporal position, the next section[1] with the height, the last with
  the width; where the three positions agree (text tokens) this equals `rope_tables`."""
  axis_of_freq = jnp.repeat(jnp.arange(3), jnp.asarray(section), total_repeat_length=inv_freq.shape[0])
  per_freq = jnp.moveaxis(jnp.take(positions, axis_of_freq, axis=0), 0, -1)  # [B, T, hd/2]
  freqs = per_freq.astype(jnp.float32) * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def position_tables(positions: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) float32[B, T, hd] for positions int32[B, T], or [3, B, T] (a model with
  `mrope_section`: temporal / height / width positions, `mrope_tables`)."""
  inv_freq = rope_inv_freq(cfg)
  if positions.ndim == 3:
    if not cfg.mrope_section or positions.shape[0] != 3:
      raise ValueError(
        f"positions of shape {positions.shape} ([3, B, T] multimodal positions) need a model with mrope_section "
        f"(model_type {cfg.model_type!r} has {cfg.mrope_section or 'none'})"
      )
    return mrope_tables(positions, inv_freq, cfg.mrope_section)
  return rope_tables(positions, inv_freq)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x [B, T, H, hd], cos/sin [B, T, hd] -> [B, T, H, hd] (HF 'rotate_half' convention)."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos = cos[:, :, None, :].astype(x.dtype)
  sin = sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


class Linear(nnx.Module):
  """y = x W + b over the last dim.  x [..., in] -> [..., out] (compute dtype).

  `kernel` is [in, out] (`kernel_layout="in_out"`, the training and checkpoint layout) or
  [out, in] (`"out_in"`, HF/torch's layout), set by `set_kernel_layout` on a decode copy (the CPU's
  decode layout: models/cpu_kernels.py). The product is `cpu_kernels.matmul`: one dot_general over
  the last dim, with the CPU kernel's written-out backward when that switch is on. Parameter names and init match `nnx.Linear` (kernel, bias), so checkpoints carry over.
  `axes` = logical names of the kernel's (in, out) dims; `bias_axis` = the bias's (default: out's),
  for models/sharding.py (None: unnamed params, which `partition_specs` refuses).
  """

  transposable = True  # `set_kernel_layout` may swap its kernel (models/moe.py's ExpertLinear: False)

  def __init__(
    self,
    d_in: int,
    d_out: int,
    *,
    use_bias: bool,
    dtype,
    param_dtype,
    precision,
    kernel_init,
    rngs: nnx.Rngs,
    axes: tuple[str, str] | None = None,
    bias_axis: str | None = None,
  ):
    bias_axes = None if axes is None else (bias_axis or axes[1],)
    self.kernel = param_with_axes(kernel_init(rngs.params(), (d_in, d_out), param_dtype), axes)
    if use_bias:
      rngs.params()  # the key nnx.Linear spends on its (zero) bias, so random inits stay the same
      self.bias = param_with_axes(jnp.zeros((d_out,), param_dtype), bias_axes)
    else:
      self.bias = nnx.data(None)
    self.in_features, self.out_features = d_in, d_out
    self.dtype = dtype
    self.precision = precision
    self.kernel_layout = "in_out"
    self.lora_a = nnx.data(None)  # LoRA adapters (`add_lora`; models/lora.py): None = none
    self.lora_b = nnx.data(None)
    self.lora_scale = 0.0

  def add_lora(self, rank: int, alpha: float, key: jax.Array) -> None:
    """Gives this Linear LoRA adapters: y = x W (+ b) + (x A) B * (alpha / rank).

    `lora_a` [..., in, rank] (uniform in +-1/sqrt(in), PEFT's default) and `lora_b` [..., rank,
    out] (zeros, so the model is unchanged until B trains), both `nnx.LoRAParam` (a subclass of
    nnx.Param) in float32 whatever the base's dtype; leading dims follow the kernel's (a stacked
    layer's [L, ...]). Logical axes: (in's name, "lora_rank") and ("lora_rank", out's name). The
    adapters do not depend on `kernel_layout`.
    """
    if not (isinstance(rank, int) and rank >= 1):
      raise ValueError(f"LoRA rank must be an int >= 1, got {rank!r}")
    lead = tuple(self.kernel.shape[:-2])
    names = logical_axes(self.kernel)
    a_axes = b_axes = None
    if names is not None:
      lead_names, pair = tuple(names[:-2]), tuple(names[-2:])
      in_axis, out_axis = pair if self.kernel_layout == "in_out" else pair[::-1]
      a_axes, b_axes = lead_names + (in_axis, "lora_rank"), lead_names + ("lora_rank", out_axis)
    bound = 1.0 / math.sqrt(self.in_features)
    a = jax.random.uniform(key, lead + (self.in_features, rank), jnp.float32, -bound, bound)
    self.lora_a = lora_param(a, a_axes)
    self.lora_b = lora_param(jnp.zeros(lead + (rank, self.out_features), jnp.float32), b_axes)
    self.lora_scale = float(alpha) / rank

  def lora_delta(self, x: jax.Array) -> jax.Array:
    """(x A) B * scale: x [..., in] -> [..., out] (compute dtype); this Linear must have adapters."""
    a = self.lora_a[...].astype(self.dtype)
    b = self.lora_b[...].astype(self.dtype)
    xa = cpu_kernels.matmul(x.astype(self.dtype), a, True, self.precision)
    return cpu_kernels.matmul(xa, b, True, self.precision) * jnp.asarray(self.lora_scale, self.dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.kernel[...].astype(self.dtype)
    y = cpu_kernels.matmul(x.astype(self.dtype), kernel, self.kernel_layout == "in_out", self.precision)
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    if self.lora_a is not None:
      y = y + self.lora_delta(x)
    return y


def lora_param(value: jax.Array, axes: tuple | None) -> nnx.LoRAParam:
  """An nnx.LoRAParam of `value` whose dims carry the logical names `axes` (see param_with_axes)."""
  if axes is None:
    return nnx.LoRAParam(value)
  if len(axes) != jnp.ndim(value):
    raise ValueError(f"logical axes {axes} do not fit a LoRA param of shape {jnp.shape(value)}")
  return nnx.LoRAParam(value, out_sharding=tuple(axes), eager_sharding=False)


def project(x: jax.Array, linears, fuse: bool) -> list[jax.Array]:
  """[l(x) for l in linears], as one GEMM (`cpu_kernels.fused_linear`) where the CPU kernels fuse
  them (`fuse` = ModelConfig.fuse_projections, the switch on, enough rows)."""
  if cpu_kernels.fuses(x, fuse):
    return cpu_kernels.fused_linear(x, linears)
  return [l(x) for l in linears]


def set_kernel_layout(model: nnx.Module, layout: str) -> nnx.Module:
  """Puts every `Linear` of `model` in `layout` ("in_out" | "out_in"); returns `model`.

  A Linear whose layout changes gets a new, transposed kernel Param (a copy); its old Param
  object is left as it was, so a model made by `nnx.merge` from another model's state changes
  without touching the other model's arrays.
  """
  if layout not in KERNEL_LAYOUTS:
    raise ValueError(f"kernel layout must be one of {KERNEL_LAYOUTS}, got {layout!r}")
  for _, module in nnx.iter_modules(model):
    if isinstance(module, Linear) and module.transposable and module.kernel_layout != layout:
      names = logical_axes(module.kernel)  # the last two dims swap (a scanned model's are [L, ., .])
      kernel = jnp.swapaxes(module.kernel[...], -1, -2)
      module.kernel = param_with_axes(kernel, None if names is None else (*names[:-2], names[-1], names[-2]))
      module.kernel_layout = layout
  return model


def linear(
  cfg: ModelConfig,
  d_in: int,
  d_out: int,
  bias: bool,
  rngs: nnx.Rngs,
  *,
  axes: tuple[str, str],
  bias_axis: str | None = None,
) -> Linear:
  """A Linear of `cfg`'s dtypes/init; `axes` = logical names of (in, out) (models/sharding.py)."""
  return Linear(
    d_in,
    d_out,
    use_bias=bias,
    dtype=cfg.compute_dtype,
    param_dtype=cfg.params_dtype,
    precision=cfg.matmul_precision,
    kernel_init=nnx.initializers.normal(cfg.initializer_range),
    rngs=rngs,
    axes=axes,
    bias_axis=bias_axis,
  )


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE, optional q/k RMSNorm (Qwen3) and a KV cache."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, hd = cfg.hidden_size, cfg.head_dim
    self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
    self.dtype = cfg.compute_dtype
    self.precision = cfg.matmul_precision
    self.attention_chunk = cfg.attention_chunk
    self.attention_impl = cfg.attention_impl
    self.fuse_projections = cfg.fuse_projections
    self.q_proj = linear(cfg, d, self.num_heads * hd, cfg.qkv_bias, rngs, axes=("embed", "q_heads"))
    self.k_proj = linear(cfg, d, self.num_kv_heads * hd, cfg.qkv_bias, rngs, axes=("embed", "kv_heads"))
    self.v_proj = linear(cfg, d, self.num_kv_heads * hd, cfg.qkv_bias, rngs, axes=("embed", "kv_heads"))
    self.o_proj = linear(
      cfg, self.num_heads * hd, d, cfg.o_bias, rngs, axes=("q_heads_in", "embed_out"), bias_axis="embed_vector"
    )
    if cfg.qk_norm:
      norm = dict(eps=cfg.rms_norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype, axis="head_dim")
      self.q_norm = RMSNorm(hd, **norm)
      self.k_norm = RMSNorm(hd, **norm)
    else:
      self.q_norm = self.k_norm = None

  def __call__(self, x, cos, sin, mask, kv=None, cache_index=None):
    """x [B, T, D]; cos/sin [B, T, hd]; mask bool[B, T, S] (True = may attend), or with
    attention_impl "pallas" and no `kv` int32[B, T] segment ids (pallas_attention.segment_ids_for).

    Without `kv`, S == T. With `kv` = (k [B*KVH, hd, S], v [B*KVH, S, hd]) (one layer of a
    KVCache, S = cache length), the new keys/values are written at slots
    [cache_index, cache_index + T) before attending. With `kv` and `cache_index=None` (a prefill
    into an empty cache): `mask` is the no-cache one (S == T); the queries attend among themselves
    as without a cache (the Pallas kernel / flash blocks: no [T, S] scores over the cache) and the
    keys/values are written at slots [0, T).
    Returns (out [B, T, D], (k, v) or None).
    """
    b, t, _ = x.shape
    q, k, v = project(x, (self.q_proj, self.k_proj, self.v_proj), self.fuse_projections)
    q = constrain(q.reshape(b, t, self.num_heads, self.head_dim), ("act_batch", "act_length", "act_heads", None))
    k = constrain(k.reshape(b, t, self.num_kv_heads, self.head_dim), ("act_batch", "act_length", "act_kv_heads", None))
    v = constrain(v.reshape(b, t, self.num_kv_heads, self.head_dim), ("act_batch", "act_length", "act_kv_heads", None))
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if isinstance(mask, PageTable):  # the paged cache: kv = this layer's (k_pages, v_pages)
      return self._paged(q, k, v, kv, mask)
    if kv is None or cache_index is None:  # training / scoring, or a prefill into an empty cache
      out = constrain(self._attend_within(q, k, v, mask), ("act_batch", "act_length", "act_heads"))
      return self.o_proj(out), None if kv is None else self._write_cache(kv, k, v, 0)
    # Cache layouts (see KVCache): keys [B*KVH, hd, S], values [B*KVH, S, hd], so both attention
    # products are plain 3-D batched matmuls (q @ K, probs @ V) straight on the updated caches.
    # (With [B, KVH, S, hd] XLA's CPU backend transposed or copied every layer's cache at every
    # decode step, and ran the two-batch-dim products slower: lab/results/cpu_code_paths/README.md.)
    k, v = self._write_cache(kv, k, v, cache_index)
    out = self._attend(q, k.astype(self.dtype), v.astype(self.dtype), mask, keys_transposed=True)
    return self.o_proj(out), (k, v)

  def _paged(self, q, k, v, kv, table: PageTable):
    """Writes k / v [B, T, KVH, hd] into this layer's pages at `table.write_slots`, then attends over each
    row's pages (models/paged_attention.py; attention_impl "pallas": pages stored heads first, decode steps
    through the Pallas kernel). kv: (k_pages, v_pages), or (k, v, layer index) for the scanned layers' stacked
    pages. Returns (out [B, T, D], (k_pages, v_pages))."""
    heads_first = cache_heads_first(self.attention_impl)
    layer = kv[2] if len(kv) == 3 else None  # (k, v, index): every layer's stacked pages, this one's by index
    k_pages = write_pages(kv[0], k, table.write_slots, heads_first=heads_first, layer=layer)
    v_pages = write_pages(kv[1], v, table.write_slots, heads_first=heads_first, layer=layer)
    if self.attention_impl == "pallas" and q.shape[1] == 1:
      out = pallas_paged_decode(q, k_pages, v_pages, table, layer=layer)
    else:
      out = paged_attend(
        q, k_pages, v_pages, table, dtype=self.dtype, precision=self.precision, heads_first=heads_first, layer=layer
      )
    return self.o_proj(out.astype(self.dtype)), (k_pages, v_pages)

  def _attend_within(self, q, k, v, mask):
    """Attention of q [B, T, H, hd] over the same T keys / values [B, T, KVH, hd] (no cache):
    the Pallas kernel (mask: int32[B, T] segment ids) or `_attend` (mask: bool[B, T, T])."""
    if self.attention_impl == "pallas":
      return pallas_causal_attention(q, k, v, mask)
    b, t = q.shape[:2]
    kvh, hd = self.num_kv_heads, self.head_dim
    # [B*KVH, S, hd] keys and values (S == T), contracted as they are.
    k = k.transpose(0, 2, 1, 3).reshape(b * kvh, t, hd)
    v = v.transpose(0, 2, 1, 3).reshape(b * kvh, t, hd)
    return self._attend(q, k, v, mask, keys_transposed=False)

  def _write_cache(self, kv, k, v, cache_index):
    """One layer's (k [B*KVH, hd, S], v [B*KVH, S, hd]) cache with k / v [B, T, KVH, hd] written
    at slots [cache_index, cache_index + T)."""
    k_cache, v_cache = kv
    b, t = k.shape[:2]
    kvh, hd = self.num_kv_heads, self.head_dim
    k_new = k.transpose(0, 2, 3, 1).reshape(b * kvh, hd, t).astype(k_cache.dtype)
    v_new = v.transpose(0, 2, 1, 3).reshape(b * kvh, t, hd).astype(v_cache.dtype)
    k = jax.lax.dynamic_update_slice(k_cache, k_new, (0, 0, cache_index))
    v = jax.lax.dynamic_update_slice(v_cache, v_new, (0, cache_index, 0))
    return k, v

  def _attend(self, q, k, v, mask, *, keys_transposed: bool):
    """Masked softmax attention; see `attend`. Without a cache and with `attention_chunk` > 0,
    queries go `attention_chunk` at a time: `flash_causal_attention` (attention_impl "flash",
    at any length: one block when T <= chunk) or `chunked_causal_attention` ("checkpoint", only
    when T > chunk)."""
    chunk = self.attention_chunk
    if not keys_transposed and chunk and self.attention_impl == "flash":
      return flash_causal_attention(
        q, k, v, mask, num_kv_heads=self.num_kv_heads, chunk=chunk, dtype=self.dtype, precision=self.precision
      )
    if not keys_transposed and chunk and q.shape[1] > chunk:
      return chunked_causal_attention(
        q, k, v, mask, num_kv_heads=self.num_kv_heads, chunk=chunk, dtype=self.dtype, precision=self.precision
      )
    return attend(
      q,
      k,
      v,
      mask,
      num_kv_heads=self.num_kv_heads,
      keys_transposed=keys_transposed,
      dtype=self.dtype,
      precision=self.precision,
    )


def attend(q, k, v, mask, *, num_kv_heads: int, keys_transposed: bool, dtype, precision):
  """Masked softmax attention with (batch row, kv head) pairs folded into one batch dim.

  Args:
    q: [B, T, H, hd] (RoPE applied).
    k: [B*KVH, hd, S] if `keys_transposed`, else [B*KVH, S, hd].
    v: [B*KVH, S, hd].
    mask: bool[B, T, S], True = may attend.
  Returns:
    [B, T, H * hd].

  Both products are plain 3-D batched matmuls: XLA's CPU backend runs those faster than the same
  contraction written with two batch dims (B and KVH), forward and backward
  (lab/results/cpu_code_paths/README.md).
  """
  b, t, h, hd = q.shape
  kvh, s = num_kv_heads, v.shape[1]
  g = h // kvh
  q = q.reshape(b, t, kvh, g, hd).transpose(0, 2, 3, 1, 4).reshape(b * kvh, g * t, hd)
  batch_dims = ((0,), (0,))
  k_contract = (1,) if keys_transposed else (2,)
  scores = jax.lax.dot_general(q, k, (((2,), k_contract), batch_dims), precision=precision)
  scores = scores.reshape(b, kvh, g, t, s).astype(jnp.float32) / math.sqrt(hd)
  scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(dtype).reshape(b * kvh, g * t, s)
  out = jax.lax.dot_general(probs, v, (((2,), (1,)), batch_dims), precision=precision)
  return out.reshape(b, kvh, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, h * hd)


def chunked_causal_attention(q, k, v, mask, *, num_kv_heads: int, chunk: int, dtype, precision):
  """Causal self-attention (no cache) a block of `chunk` queries at a time: block [s, e) attends
  to keys [0, e) only (the masked upper triangle beyond e is never computed), and each block runs
  under `jax.checkpoint`, so the backward pass recomputes its scores instead of keeping the
  [B, H, T, T] probabilities. Same args/result as `attend` with k [B*KVH, T, hd]; `mask` must be
  causal (keys past the query never allowed), as `build_attention_mask` makes it.
  """
  t = q.shape[1]
  block = jax.checkpoint(
    functools.partial(attend, num_kv_heads=num_kv_heads, keys_transposed=False, dtype=dtype, precision=precision)
  )
  outs = []
  for start in range(0, t, chunk):
    end = min(t, start + chunk)
    outs.append(block(q[:, start:end], k[:, :end], v[:, :end], mask[:, start:end, :end]))
  return jnp.concatenate(outs, axis=1)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)).  [B, T, D] -> [B, T, D]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, i = cfg.hidden_size, cfg.intermediate_size
    self.fuse_projections = cfg.fuse_projections
    self.gate_proj = linear(cfg, d, i, cfg.mlp_bias, rngs, axes=("embed", "mlp"))
    self.up_proj = linear(cfg, d, i, cfg.mlp_bias, rngs, axes=("embed", "mlp"))
    self.down_proj = linear(cfg, i, d, cfg.mlp_bias, rngs, axes=("mlp_in", "embed_out"), bias_axis="embed_vector")

  def __call__(self, x):
    gate, up = project(x, (self.gate_proj, self.up_proj), self.fuse_projections)
    return self.down_proj(constrain(jax.nn.silu(gate) * up, ("act_batch", "act_length", "act_mlp")))
