"""A paged KV cache and attention over it: keys / values in fixed-size pages, per-sequence block tables.

    cache = model.init_paged_cache(num_pages, page_size)              # PagedKVCache
    table = PageTable.build(block_tables, positions, valid, page_size)  # where each token reads / writes
    hidden, cache = model.hidden_states(ids, positions=positions, cache=cache, pages=table)

Pages are shared by every row of a batch: row b's keys live in pages `block_tables[b]` (int32[B, P]), token
position p of that row in page `block_tables[b, p // page_size]` at offset `p % page_size`. Page 0 is the sink:
the allocator never hands it out, padding tokens write there and padding entries of a block table point there
(their keys sit at positions past the row's length, which the causal mask hides).

The XLA path here (CPU / GPU) gathers a row's pages into one [S = P * page_size] key / value run and attends
over it with a causal mask on positions; `P` is a static bucket (the engine picks the smallest that holds the
longest live row), so the gather reads no more than that. On TPU `attention_impl="pallas"` sends decode steps
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
  """

  block_tables: jax.Array
  positions: jax.Array
  write_slots: jax.Array
  page_size: int = dataclasses.field(metadata=dict(static=True))

  @classmethod
  def build(cls, block_tables: jax.Array, positions: jax.Array, valid: jax.Array, page_size: int) -> "PageTable":
    """block_tables int32[B, P], positions int32[B, T], valid bool[B, T] (False: padding, writes to the sink)."""
    page_index = jnp.clip(positions // page_size, 0, block_tables.shape[1] - 1)
    pages = jnp.take_along_axis(block_tables, page_index, axis=1)
    slots = pages * page_size + positions % page_size
    sink = SINK_PAGE * page_size + positions % page_size
    return cls(block_tables, positions, jnp.where(valid, slots, sink).astype(jnp.int32), page_size)


def write_pages(pages: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
  """pages [N, page, KVH, hd] with new [B, T, KVH, hd] written at flat slots int32[B, T]."""
  n, page, kvh, hd = pages.shape
  flat = pages.reshape(n * page, kvh, hd)
  flat = flat.at[slots.reshape(-1)].set(new.reshape(-1, kvh, hd).astype(pages.dtype), mode="drop")
  return flat.reshape(n, page, kvh, hd)


def paged_attend(q, k_pages, v_pages, table: PageTable, *, dtype, precision):
  """Causal attention of q [B, T, H, hd] (RoPE applied) over each row's pages.

  k_pages / v_pages: [N, page, KVH, hd] (this layer, the new tokens already written). Query t of row b sees the
  row's positions <= table.positions[b, t]. Returns [B, T, H * hd].
  """
  b, t, h, hd = q.shape
  kvh = k_pages.shape[2]
  g = h // kvh
  p = table.block_tables.shape[1]
  s = p * table.page_size
  keys = k_pages[table.block_tables].reshape(b, s, kvh, hd).astype(dtype)  # [B, S, KVH, hd]
  values = v_pages[table.block_tables].reshape(b, s, kvh, hd).astype(dtype)
  q = q.reshape(b, t, kvh, g, hd)
  scores = jnp.einsum("btkgd,bskd->bkgts", q, keys, precision=precision).astype(jnp.float32) / math.sqrt(hd)
  allowed = jnp.arange(s)[None, None, :] <= table.positions[:, :, None]  # [B, T, S]
  scores = jnp.where(allowed[:, None, None], scores, -1e30)
  probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, values, precision=precision)
  return out.reshape(b, t, h * hd)


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
