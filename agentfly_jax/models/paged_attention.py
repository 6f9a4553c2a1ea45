"""A paged KV cache and attention over it: keys / values in fixed-size pages, per-sequence block tables.

    cache = model.init_paged_cache(num_pages, page_size)              # PagedKVCache
    table = PageTable.build(block_tables, positions, valid, page_size)  # where each token reads / writes
    hidden, cache = model.hidden_states(ids, positions=positions, cache=cache, pages=table)

Pages are shared by every row of a batch: row b's keys live in pages `block_tables[b]` (int32[B, P]), token
position p of that row in page `block_tables[b, p // page_size]` at offset `p % page_size`. Page 0 is the sink:
the allocator never hands it out, padding tokens write there and padding entries of a block table point there
(their keys sit at positions past the row's length, which the causal mask hides).

The XLA path here (CPU / GPU) gathers a few pages of every row at a time and folds them in with an online
softmax, visiting only the blocks up to the longest row's last position: one compiled program for every
context length, reading only the keys there are (`paged_attend`). On TPU `attention_impl="pallas"` sends decode steps
to JAX's Pallas paged-attention kernel (`pallas_paged_decode`), which reads pages in place.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

SINK_PAGE = 0  # never allocated: padding tokens write here, padding block-table entries point here


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
  """Key / value pages, one pair per decoder layer.

  Attributes:
    k, v: tuple of num_layers arrays [num_pages, page_size, num_kv_heads, head_dim], or (`stacked`, the scanned
      model's layout) one array [num_layers, num_pages, page_size, num_kv_heads, head_dim] each.
  """

  k: tuple | jax.Array
  v: tuple | jax.Array

  @classmethod
  def zeros(cls, num_layers, num_pages, page_size, num_kv_heads, head_dim, dtype=jnp.float32, *, stacked=False):
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    if stacked:
      return cls(k=jnp.zeros((num_layers, *shape), dtype), v=jnp.zeros((num_layers, *shape), dtype))
    return cls(
      k=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
      v=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
    )

  @property
  def stacked(self) -> bool:
    return not isinstance(self.k, (tuple, list))

  @property
  def num_layers(self) -> int:
    return self.k.shape[0] if self.stacked else len(self.k)

  @property
  def page_size(self) -> int:
    return (self.k if self.stacked else self.k[0]).shape[-3]

  @property
  def num_pages(self) -> int:
    return (self.k if self.stacked else self.k[0]).shape[-4]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PageTable:
  """Where each query token of a batch reads and writes its keys / values.

  Attributes:
    block_tables: int32[B, P] page ids of each row (padding: SINK_PAGE).
    positions: int32[B, T] the absolute position of each query token (its RoPE position and cache slot).
    write_slots: int32[B, T] flat slot (page * page_size + offset) each token's key / value goes to (padding
      tokens: the sink page).
    page_size: static.
    block_pages: static, pages per block of the attention loop (`paged_attend`; P is a multiple of it).
  """

  block_tables: jax.Array
  positions: jax.Array
  write_slots: jax.Array
  page_size: int = dataclasses.field(metadata=dict(static=True))
  block_pages: int = dataclasses.field(default=8, metadata=dict(static=True))

  @classmethod
  def build(
    cls, block_tables: jax.Array, positions: jax.Array, valid: jax.Array, page_size: int, block_pages: int = 8
  ) -> "PageTable":
    """block_tables int32[B, P], positions int32[B, T], valid bool[B, T] (False: padding, writes to the sink)."""
    page_index = jnp.clip(positions // page_size, 0, block_tables.shape[1] - 1)
    pages = jnp.take_along_axis(block_tables, page_index, axis=1)
    slots = pages * page_size + positions % page_size
    sink = SINK_PAGE * page_size + positions % page_size
    return cls(block_tables, positions, jnp.where(valid, slots, sink).astype(jnp.int32), page_size, block_pages)


def write_pages(pages: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
  """pages [N, page, KVH, hd] with new [B, T, KVH, hd] written at flat slots int32[B, T]."""
  n, page, kvh, hd = pages.shape
  flat = pages.reshape(n * page, kvh, hd)
  flat = flat.at[slots.reshape(-1)].set(new.reshape(-1, kvh, hd).astype(pages.dtype), mode="drop")
  return flat.reshape(n, page, kvh, hd)


def paged_attend(q, k_pages, v_pages, table: PageTable, *, dtype, precision):
  """Causal attention of q [B, T, H, hd] (RoPE applied) over each row's pages, a block of pages at a time.

  k_pages / v_pages: [N, page, KVH, hd] (this layer, the new tokens already written); table.block_tables'
  width must be a multiple of `table.block_pages`. Query t of row b sees the row's positions <= table.positions[b, t].
  Blocks of keys are gathered and folded in with an online softmax (flash-decoding), and only the blocks
  up to the longest row's last position are visited (a loop with a data-dependent trip count), so one
  compiled program serves every context length at the cost of the keys it really reads.
  Returns [B, T, H * hd].
  """
  b, t, h, hd = q.shape
  kvh = k_pages.shape[2]
  g = h // kvh
  width, block_pages = table.block_tables.shape[1], table.block_pages
  if width % block_pages:
    raise ValueError(f"block-table width {width} is not a multiple of block_pages={block_pages}")
  span = block_pages * table.page_size
  q = (q.reshape(b, t, kvh, g, hd) / math.sqrt(hd)).astype(dtype)
  positions = table.positions[:, :, None]  # [B, T, 1]
  num_blocks = jnp.minimum(jnp.max(table.positions) // span + 1, width // block_pages)

  def body(i, carry):
    m, l, acc = carry
    pages = jax.lax.dynamic_slice_in_dim(table.block_tables, i * block_pages, block_pages, axis=1)
    keys = k_pages[pages].reshape(b, span, kvh, hd).astype(dtype)
    values = v_pages[pages].reshape(b, span, kvh, hd).astype(dtype)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, keys, precision=precision).astype(jnp.float32)
    allowed = (i * span + jnp.arange(span))[None, None, :] <= positions  # [B, T, S]
    scores = jnp.where(allowed[:, None, None], scores, -jnp.inf)
    m_new = jnp.maximum(m, scores.max(-1))  # block 0 always holds position 0: finite from the first block
    scale = jnp.exp(m - m_new)
    p = jnp.exp(scores - m_new[..., None])
    l = l * scale + p.sum(-1)
    acc = acc * scale[..., None] + jnp.einsum("bkgts,bskd->bkgtd", p.astype(dtype), values, precision=precision)
    return m_new, l, acc

  init = (
    jnp.full((b, kvh, g, t), -jnp.inf, jnp.float32),
    jnp.zeros((b, kvh, g, t), jnp.float32),
    jnp.zeros((b, kvh, g, t, hd), jnp.float32),
  )
  _, l, acc = jax.lax.fori_loop(0, num_blocks, body, init)
  out = acc / l[..., None]  # [B, KVH, G, T, hd]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h * hd)


def pallas_paged_decode(q, k_pages, v_pages, table: PageTable, *, pages_per_compute_block: int = 8):
  """One decode step (T = 1) through JAX's Pallas TPU paged-attention kernel, reading pages in place.

  q [B, 1, H, hd]; k_pages / v_pages [N, page, KVH, hd] (the kernel wants [KVH, N, page, hd]: a transpose the
  TPU engine keeps out of the loop by storing that layout would be the next step; here it is per call).
  Returns [B, 1, H * hd]. TPU only (the kernel lowers through Mosaic).
  """
  from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

  b, t, h, hd = q.shape
  if t != 1:
    raise ValueError(f"pallas_paged_decode takes one query token per row, got {t}")
  lengths = table.positions[:, 0] + 1
  k = jnp.transpose(k_pages, (2, 0, 1, 3))
  v = jnp.transpose(v_pages, (2, 0, 1, 3))
  block = min(pages_per_compute_block, table.block_tables.shape[1])
  out = paged_attention(
    q[:, 0] / math.sqrt(hd), k, v, lengths, table.block_tables, pages_per_compute_block=block
  )  # [B, H, hd]
  return out.reshape(b, 1, h * hd).astype(q.dtype)
