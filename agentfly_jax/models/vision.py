"""The Qwen2.5-VL vision tower (HF `visual.*`): patch embedding, 2-D rotary, window attention, merger.

    layout = vision_layout(image_grid_thw, cfg.vision)     # host: numpy index arrays from the grids
    feats = VisionTower(cfg, rngs=rngs)(pixel_values, layout)   # [N, patch_dim] -> [N / m^2, D_lm]

pixel_values [N, patch_dim] are the image processor's patches (each row one temporal_patch_size x
patch_size x patch_size patch of in_channels, channels first), images one after another, each
image's patches in m x m blocks (m = spatial_merge_size) as the processor orders them. The tower
reorders the merged blocks window by window (`VisionLayout.window_index`), runs its blocks with
attention restricted to one image frame (the blocks of `fullatt_block_indexes`) or one window (the
others) by a block mask over segment ids, merges each m x m block into one vector for the LM and
puts them back in image order. HF's Conv3d with kernel = stride is the one dot_general of
`PatchEmbed`. With `ModelConfig.scan_layers` the blocks are scanned as the LM's decoder layers are:
`visual.blocks` is one VisionBlock whose params carry a leading [depth] axis (logical name "layers",
layer_stack.py converts between the layouts), run under `lax.scan` with each block's full-or-window
choice a scanned boolean (`full_attention_flags`) selecting its segment ids, and the LM's remat
policy (`ModelConfig.remat`) inside the scan body: without it a trained tower's backward pass keeps
every block's intermediates stacked [depth, ...] (13 GiB a chip more than unrolled in the
Qwen2.5-VL-3B train step on v5p:2x2x2: lab/results/vl_tower_scan/README.md). Unrolled (`nnx.List`
of blocks, no remat) otherwise.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentfly_jax.models.causal_lm import tied_to_iteration
from agentfly_jax.models.config import ModelConfig
from agentfly_jax.models.flash_attention import _MASK_VALUE
from agentfly_jax.models.layer_stack import LAYERS
from agentfly_jax.models.layers import RMSNorm, linear
from agentfly_jax.models.remat import scan_body
from agentfly_jax.models.sharding import param_with_axes
from agentfly_jax.models.vision_config import VisionConfig


class VisionLayout(NamedTuple):
  """Index arrays of one batch of images (N patches, M = N / m^2 merged tokens), from their grids.

  window_index int32[M]: the merged token (image order) at each position of the window order;
  reverse_index int32[M]: its inverse; full_segments / window_segments int32[N]: each patch's image
  frame / window, in window order; rotary_positions int32[N, 2]: each patch's (row, column) in its
  image, in window order."""

  window_index: np.ndarray
  reverse_index: np.ndarray
  full_segments: np.ndarray
  window_segments: np.ndarray
  rotary_positions: np.ndarray


def check_grids(image_grid_thw, vcfg: VisionConfig) -> np.ndarray:
  """image_grid_thw [I, 3] (t, h, w patches per image) as int64 numpy; ValueError naming a bad grid."""
  grid = np.asarray(image_grid_thw)
  if grid.ndim != 2 or grid.shape[1] != 3 or not np.issubdtype(grid.dtype, np.integer):
    raise ValueError(f"image_grid_thw must be an int array [num_images, 3] (t, h, w), got {grid.dtype}{grid.shape}")
  m = vcfg.spatial_merge_size
  for i, (t, h, w) in enumerate(grid.tolist()):
    if t < 1 or h < 1 or w < 1 or h % m or w % m:
      raise ValueError(
        f"image_grid_thw[{i}] = {(t, h, w)}: t, h, w must be >= 1 and h, w multiples of spatial_merge_size {m}"
      )
  return grid.astype(np.int64)


def _image_windows(t: int, lh: int, lw: int, ws: int):
  """Per frame, per window (row-major over windows): the merged-token indices (row-major within the
  window) of one image of t frames of lh x lw merged tokens, windows ws x ws."""
  for f in range(t):
    for r0 in range(0, lh, ws):
      for c0 in range(0, lw, ws):
        rows, cols = np.arange(r0, min(r0 + ws, lh)), np.arange(c0, min(c0 + ws, lw))
        yield f, (f * lh * lw + rows[:, None] * lw + cols[None, :]).reshape(-1)


def vision_layout(image_grid_thw, vcfg: VisionConfig) -> VisionLayout:
  """The VisionLayout of images with grids image_grid_thw [I, 3] (host numpy; the grids are data)."""
  grid = check_grids(image_grid_thw, vcfg)
  m, ws = vcfg.spatial_merge_size, vcfg.window_merged
  unit = m * m
  order, frame_of, window_of, positions = [], [], [], []
  offset = frames = windows = 0
  for t, h, w in grid.tolist():
    lh, lw = h // m, w // m
    for f, idx in _image_windows(t, lh, lw, ws):
      order.append(offset + idx)
      frame_of.append(np.full(idx.size, frames + f))
      window_of.append(np.full(idx.size, windows))
      windows += 1
    rows = np.arange(lh)[:, None, None, None] * m + np.arange(m)[None, None, :, None]
    cols = np.arange(lw)[None, :, None, None] * m + np.arange(m)[None, None, None, :]
    rc = np.stack(np.broadcast_arrays(rows, cols), axis=-1).reshape(-1, 2)  # block-major (row, column)
    positions.append(np.tile(rc, (t, 1)))
    offset += t * lh * lw
    frames += t
  window_index = np.concatenate(order).astype(np.int32)
  rotary = np.concatenate(positions).reshape(-1, unit, 2)[window_index].reshape(-1, 2)
  return VisionLayout(
    window_index=window_index,
    reverse_index=np.argsort(window_index).astype(np.int32),
    full_segments=np.repeat(np.concatenate(frame_of), unit).astype(np.int32),
    window_segments=np.repeat(np.concatenate(window_of), unit).astype(np.int32),
    rotary_positions=rotary.astype(np.int32),
  )


def padded_layout(grids: np.ndarray, num_patches: int, vcfg) -> tuple:
  """(the VisionLayout of `grids` plus one padding image up to `num_patches` patches, the padding
  image's grid or None). num_patches - the grids' patches must be a multiple of spatial_merge_size**2."""
  m = vcfg.spatial_merge_size
  real = int(np.prod(grids, axis=1).sum()) if len(grids) else 0
  pad = num_patches - real
  if pad < 0 or pad % (m * m):
    raise ValueError(f"padded_layout: {real} patches do not pad to {num_patches} in whole {m}x{m} blocks")
  full = np.asarray(grids, np.int64).reshape(-1, 3)
  pad_grid = None
  if pad:
    pad_grid = np.array([1, m, pad // m], np.int64)
    full = np.concatenate([full, pad_grid[None]])
  return vision_layout(full, vcfg), pad_grid


def vision_rope(rotary_positions: jax.Array, vcfg: VisionConfig) -> tuple[jax.Array, jax.Array]:
  """rotary_positions int[N, 2] (row, column) -> (cos, sin) float32[N, head_dim]: the first quarter
  of the frequencies turn with the row, the second with the column, and the halves repeat."""
  quarter = vcfg.head_dim // 4
  inv_freq = 1.0 / (vcfg.rope_theta ** (jnp.arange(0, 2 * quarter, 2, dtype=jnp.float32) / (2 * quarter)))
  freqs = rotary_positions.astype(jnp.float32)[:, :, None] * inv_freq  # [N, 2, hd/4]
  emb = freqs.reshape(freqs.shape[0], -1)
  emb = jnp.concatenate([emb, emb], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def _vision_linear(cfg: ModelConfig, d_in, d_out, rngs, axes, bias_axis=None):
  return linear(cfg, d_in, d_out, True, rngs, axes=axes, bias_axis=bias_axis)


class PatchEmbed(nnx.Module):
  """HF's Conv3d(kernel = stride = (temporal_patch_size, patch, patch), no bias) on whole patches:
  pixel_values [N, C * Tp * P * P] -> [N, D], one dot_general with kernel [C, Tp, P, P, D] (HF's
  weight [D, C, Tp, P, P] with its output dim moved last)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    v = cfg.vision
    self.shape = (v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    self.dtype, self.precision = cfg.compute_dtype, cfg.matmul_precision
    init = nnx.initializers.normal(v.initializer_range)(rngs.params(), self.shape + (v.hidden_size,), cfg.params_dtype)
    self.kernel = param_with_axes(init, ("vision_patch",) * 4 + ("embed",))

  def __call__(self, pixel_values: jax.Array) -> jax.Array:
    x = pixel_values.astype(self.dtype).reshape((-1,) + self.shape)
    dims = (((1, 2, 3, 4), (0, 1, 2, 3)), ((), ()))
    return jax.lax.dot_general(x, self.kernel[...].astype(self.dtype), dims, precision=self.precision)


class VisionAttention(nnx.Module):
  """Multi-head self-attention over all N patches of a batch of images, a block mask keeping each
  patch to its own segment (frame or window); 2-D rotary on q and k."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    v = cfg.vision
    self.num_heads, self.head_dim = v.num_heads, v.head_dim
    self.dtype, self.precision = cfg.compute_dtype, cfg.matmul_precision
    self.qkv = _vision_linear(cfg, v.hidden_size, 3 * v.hidden_size, rngs, ("embed", "q_heads"))
    self.proj = _vision_linear(cfg, v.hidden_size, v.hidden_size, rngs, ("q_heads_in", "embed_out"), "embed_vector")

  def __call__(self, x, cos, sin, segments):
    """x [N, D], cos / sin float32[N, hd], segments int32[N] -> [N, D]."""
    n = x.shape[0]
    qkv = self.qkv(x).reshape(n, 3, self.num_heads, self.head_dim)
    q, k, val = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    scores = jnp.einsum("qhd,khd->hqk", q, k, precision=self.precision).astype(jnp.float32)
    scores = scores / math.sqrt(self.head_dim)
    scores = jnp.where((segments[:, None] == segments[None, :])[None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    out = jnp.einsum("hqk,khd->qhd", probs, val, precision=self.precision)
    return self.proj(out.reshape(n, -1))


def _rotate(x, cos, sin):
  """x [N, H, hd] rotated (HF rotate_half convention, in float32) -> x's dtype."""
  half = x.shape[-1] // 2
  x32 = x.astype(jnp.float32)
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).astype(x.dtype)


class VisionMLP(nnx.Module):
  """Gated MLP with biases: down(silu(gate(x)) * up(x)).  [N, D] -> [N, D]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, i = cfg.vision.hidden_size, cfg.vision.intermediate_size
    self.gate_proj = _vision_linear(cfg, d, i, rngs, ("embed", "mlp"))
    self.up_proj = _vision_linear(cfg, d, i, rngs, ("embed", "mlp"))
    self.down_proj = _vision_linear(cfg, i, d, rngs, ("mlp_in", "embed_out"), "embed_vector")

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nnx.Module):
  """Pre-norm block: x + attn(norm1(x)); then + mlp(norm2(x)) (norms' eps 1e-6, as HF's)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d = cfg.vision.hidden_size
    norm = dict(eps=1e-6, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype)
    self.norm1 = RMSNorm(d, **norm)
    self.norm2 = RMSNorm(d, **norm)
    self.attn = VisionAttention(cfg, rngs=rngs)
    self.mlp = VisionMLP(cfg, rngs=rngs)

  def __call__(self, x, cos, sin, segments):
    x = x + self.attn(self.norm1(x), cos, sin, segments)
    return x + self.mlp(self.norm2(x))


def full_attention_flags(vcfg: VisionConfig) -> np.ndarray:
  """bool[depth]: True for the blocks that attend within a whole frame (`fullatt_block_indexes`)."""
  return np.isin(np.arange(vcfg.depth), np.asarray(vcfg.fullatt_block_indexes, np.int64))


def stacked_vision_blocks(cfg: ModelConfig, rngs: nnx.Rngs) -> VisionBlock:
  """One VisionBlock whose every variable has a leading [depth] axis, logical name "layers" (each
  block initialised from its own split of `rngs`)."""

  @nnx.split_rngs(splits=cfg.vision.depth)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: LAYERS})
  def make(block_rngs):
    return VisionBlock(cfg, rngs=block_rngs)

  return make(rngs)


def scan_vision_blocks(blocks: VisionBlock, x, cos, sin, full, window, flags, compute_dtype, remat=False):
  """The stacked blocks over x [N, D] with `lax.scan`, one block per iteration under the remat
  policy `remat` (models/remat.py, as the LM's scanned layers); block i attends
  within `full` (int32[N] frame ids) where flags[i] (bool[depth], `full_attention_flags`), else
  within `window` (int32[N] window ids), selected in the body so one traced block serves all.
  Weights are cast to `compute_dtype` inside the loop (causal_lm.tied_to_iteration: no
  compute-dtype copy of the whole stack)."""
  graphdef, state = nnx.split(blocks)
  depth = jax.tree.leaves(state)[0].shape[0]

  def body(h, xs):
    block_state, is_full, index = xs
    block = nnx.merge(graphdef, tied_to_iteration(block_state, index, compute_dtype))
    return block(h, cos, sin, jnp.where(is_full, full, window)), None

  x, _ = jax.lax.scan(scan_body(body, remat), x, (state, jnp.asarray(flags), jnp.arange(depth, dtype=jnp.int32)))
  return x


class PatchMerger(nnx.Module):
  """RMSNorm, then each m x m block's m^2 vectors concatenated through Linear, GELU (exact), Linear
  to the LM's width: [N, D] -> [N / m^2, D_lm]. HF's `mlp.0` / `mlp.2` (an nn.Sequential's indices)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    v = cfg.vision
    self.width = v.hidden_size * v.spatial_merge_size**2
    self.ln_q = RMSNorm(v.hidden_size, eps=1e-6, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype)
    self.mlp = nnx.Dict(
      {
        "0": _vision_linear(cfg, self.width, self.width, rngs, ("embed", "mlp")),
        "2": _vision_linear(cfg, self.width, cfg.hidden_size, rngs, ("mlp_in", "embed_out"), "embed_vector"),
      }
    )

  def __call__(self, x):
    h = self.mlp["0"](self.ln_q(x).reshape(-1, self.width))
    return self.mlp["2"](jax.nn.gelu(h, approximate=False))


class VisionTower(nnx.Module):
  """HF's Qwen2_5_VisionTransformerPretrainedModel: pixel_values [N, patch_dim] and the images'
  VisionLayout -> merged image features [N / m^2, hidden_size] (compute dtype), images in order."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    v = cfg.vision
    self.vision = v
    self.patch_embed = nnx.Dict({"proj": PatchEmbed(cfg, rngs=rngs)})  # HF: patch_embed.proj (a Conv3d)
    self.scanned = bool(cfg.scan_layers)
    self.compute_dtype, self.remat = cfg.compute_dtype, cfg.remat
    if self.scanned:
      self.blocks = stacked_vision_blocks(cfg, rngs)
    else:
      self.blocks = nnx.List([VisionBlock(cfg, rngs=rngs) for _ in range(v.depth)])
    self.merger = PatchMerger(cfg, rngs=rngs)

  def __call__(self, pixel_values: jax.Array, layout: VisionLayout) -> jax.Array:
    v = self.vision
    unit = v.spatial_merge_size**2
    n = pixel_values.shape[0]
    if pixel_values.ndim != 2 or pixel_values.shape[1] != v.patch_dim:
      raise ValueError(f"pixel_values must be [num_patches, {v.patch_dim}], got {pixel_values.shape}")
    if n != layout.full_segments.shape[0]:
      raise ValueError(f"pixel_values has {n} patches but image_grid_thw's images have {layout.full_segments.shape[0]}")
    x = self.patch_embed["proj"](pixel_values)
    x = x.reshape(n // unit, unit, -1)[jnp.asarray(layout.window_index)].reshape(n, -1)
    cos, sin = vision_rope(jnp.asarray(layout.rotary_positions), v)
    full, window = jnp.asarray(layout.full_segments), jnp.asarray(layout.window_segments)
    if self.scanned:
      flags = full_attention_flags(v)
      x = scan_vision_blocks(self.blocks, x, cos, sin, full, window, flags, self.compute_dtype, self.remat)
    else:
      for block, is_full in zip(self.blocks, full_attention_flags(v)):
        x = block(x, cos, sin, full if is_full else window)
    return self.merger(x)[jnp.asarray(layout.reverse_index)]
