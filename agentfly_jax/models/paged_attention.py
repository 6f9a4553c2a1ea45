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
to JAX's Pallas paged-attention kernel (models/pallas_paged_attention.py), which reads pages in place; prefill chunks
(T > 1) still take `paged_attend`.

Layouts (`heads_first`, static, `cache_heads_first(attention_impl)`): the XLA path stores a layer's pages
[N, page, KVH, hd] (a token's keys for every kv head side by side: one scatter row per token); the Pallas
kernel DMAs one (kv head, page) tile [page, hd] at a time and takes [KVH, N, page, hd], so a "pallas" cache is
stored that way and no step transposes the whole cache. Both paths read either layout.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from agentfly_jax.models.sharding import active_rules, constrain, spec_for_axes

SINK_PAGE = 0  # never allocated: padding tokens write here, padding block-table entries point here
# Rows per block loop of `paged_attend` on one device. XLA:CPU gathers pages at ~4 GB/s, so attention costs the
# keys it gathers: on SmolLM2 shapes (64 rows, contexts 64-500 sorted) groups of 8 took 0.55-0.75x the time of one
# loop over all rows, and the same at equal lengths (lab/results/engine_attention/README.md).
ROW_GROUP = 8


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
  """Key / value pages, one pair per decoder layer.

  Attributes:
    k, v: tuple of num_layers arrays [num_pages, page_size, num_kv_heads, head_dim] ([num_kv_heads, num_pages,
      page_size, head_dim] when `heads_first`), or (`stacked`, the scanned model's layout) one array with a
      leading num_layers dim each.
    heads_first: static, the Pallas kernel's layout (module docstring).
  """

  k: tuple | jax.Array
  v: tuple | jax.Array
  heads_first: bool = dataclasses.field(default=False, metadata=dict(static=True))

  @classmethod
  def zeros(
    cls,
    num_layers,
    num_pages,
    page_size,
    num_kv_heads,
    head_dim,
    dtype=jnp.float32,
    *,
    stacked=False,
    heads_first=False,
  ):
    if heads_first:
      shape = (num_kv_heads, num_pages, page_size, head_dim)
    else:
      shape = (num_pages, page_size, num_kv_heads, head_dim)
    if stacked:
      return cls(jnp.zeros((num_layers, *shape), dtype), jnp.zeros((num_layers, *shape), dtype), heads_first)
    return cls(
      tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
      tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
      heads_first,
    )

  def axes(self) -> tuple:
    """The logical axes (models/sharding.py) of each k / v array: kv heads by `act_kv_heads`, pages whole (every
    row of a batch may read any page)."""
    layer = ("act_kv_heads", None, None, None) if self.heads_first else (None, None, "act_kv_heads", None)
    return (None, *layer) if self.stacked else layer

  @property
  def stacked(self) -> bool:
    return not isinstance(self.k, (tuple, list))

  @property
  def num_layers(self) -> int:
    return self.k.shape[0] if self.stacked else len(self.k)

  @property
  def page_size(self) -> int:
    return (self.k if self.stacked else self.k[0]).shape[-2 if self.heads_first else -3]

  @property
  def num_pages(self) -> int:
    return (self.k if self.stacked else self.k[0]).shape[-3 if self.heads_first else -4]


def cache_heads_first(attention_impl: str) -> bool:
  """Whether a model with `attention_impl` stores its pages heads first (the Pallas kernel's layout)."""
  return attention_impl == "pallas"


def cache_shardings(cache: PagedKVCache, mesh, rules=None) -> PagedKVCache:
  """NamedShardings of `cache`'s arrays on `mesh` by `rules` (models/sharding.py; `cache.axes()`), as a
  PagedKVCache of shardings (for jax.device_put, or abstract arrays: rl/scale/aot_engine.py)."""
  from jax.sharding import NamedSharding

  axes = cache.axes()
  sh = lambda x: NamedSharding(mesh, spec_for_axes(axes, x.shape, rules, mesh, where="the paged KV cache"))
  return PagedKVCache(*jax.tree.map(sh, (cache.k, cache.v)), cache.heads_first)


def constrain_cache(cache: PagedKVCache) -> PagedKVCache:
  """`cache` with every array constrained to `cache.axes()` under the active activation_sharding (unchanged
  outside one), so a program's cache comes out with the sharding it went in with (it is donated)."""
  axes = cache.axes()
  k, v = jax.tree.map(lambda x: constrain(x, axes), (cache.k, cache.v))
  return PagedKVCache(k, v, cache.heads_first)


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


def write_pages(
  pages: jax.Array, new: jax.Array, slots: jax.Array, *, heads_first: bool = False, layer: jax.Array | None = None
) -> jax.Array:
  """pages [N, page, KVH, hd] (heads_first: [KVH, N, page, hd]) with new [B, T, KVH, hd] written at flat slots
  int32[B, T] (page * page_size + offset). `layer`: pages is the stacked [L, N, page, KVH, hd] of every layer
  and this one's slice is written (int32 scalar)."""
  kvh, hd = new.shape[2:]
  new = new.reshape(-1, kvh, hd).astype(pages.dtype)
  if layer is not None and heads_first:  # [L, KVH, N, page, hd]
    num_layers, _, n, page, _ = pages.shape
    flat = pages.reshape(num_layers, kvh, n * page, hd).at[layer, :, slots.reshape(-1)].set(new, mode="drop")
    return flat.reshape(num_layers, kvh, n, page, hd)
  if layer is not None:
    num_layers, n, page = pages.shape[:3]
    flat = pages.reshape(num_layers, n * page, kvh, hd).at[layer, slots.reshape(-1)].set(new, mode="drop")
    return flat.reshape(num_layers, n, page, kvh, hd)
  if heads_first:
    _, n, page, _ = pages.shape
    flat = pages.reshape(kvh, n * page, hd).at[:, slots.reshape(-1)].set(new.transpose(1, 0, 2), mode="drop")
    return flat.reshape(kvh, n, page, hd)
  n, page = pages.shape[:2]
  flat = pages.reshape(n * page, kvh, hd).at[slots.reshape(-1)].set(new, mode="drop")
  return flat.reshape(n, page, kvh, hd)


def paged_attend(
  q, k_pages, v_pages, table: PageTable, *, dtype, precision, heads_first: bool = False, layer: jax.Array | None = None
):
  """Causal attention of q [B, T, H, hd] (RoPE applied) over each row's pages, a block of pages at a time.

  On one device the rows go through the block loop `ROW_GROUP` at a time, each group visiting the blocks up to
  its own longest row, so a long row costs its group its length and not the whole batch (the engine orders a
  batch's rows by position: sampling/engine/scheduler.py). On a mesh the rows may be split over devices and
  go through one loop.

  k_pages / v_pages: [N, page, KVH, hd] (heads_first: [KVH, N, page, hd]; this layer, the new tokens already
  written; with `layer`, an int32 scalar: the stacked [L, ...] pages of every layer, this layer's read);
  table.block_tables' width must be a multiple of `table.block_pages`. Query t of row b sees the row's
  positions <= table.positions[b, t].
  Blocks of keys are gathered and folded in with an online softmax (flash-decoding), and only the blocks
  up to the longest row's last position are visited (a loop with a data-dependent trip count), so one
  compiled program serves every context length at the cost of the keys it really reads.
  Returns [B, T, H * hd].
  """
  kw = dict(dtype=dtype, precision=precision, heads_first=heads_first, layer=layer)
  b = q.shape[0]
  if b <= ROW_GROUP or active_rules() is not None:
    return _attend_rows(q, k_pages, v_pages, table, **kw)
  parts = []
  for s in range(0, b, ROW_GROUP):
    rows = PageTable(
      table.block_tables[s : s + ROW_GROUP],
      table.positions[s : s + ROW_GROUP],
      table.write_slots[s : s + ROW_GROUP],
      table.page_size,
      table.block_pages,
    )
    parts.append(_attend_rows(q[s : s + ROW_GROUP], k_pages, v_pages, rows, **kw))
  return jnp.concatenate(parts, axis=0)


def _attend_rows(q, k_pages, v_pages, table: PageTable, *, dtype, precision, heads_first: bool, layer):
  """paged_attend's block loop over all rows of q at once."""
  b, t, h, hd = q.shape
  kvh = k_pages.shape[(0 if heads_first else 2) + (layer is not None)]
  g = h // kvh
  width, block_pages = table.block_tables.shape[1], table.block_pages
  if width % block_pages:
    raise ValueError(f"block-table width {width} is not a multiple of block_pages={block_pages}")
  span = block_pages * table.page_size
  q = (q.reshape(b, t, kvh, g, hd) / math.sqrt(hd)).astype(dtype)
  positions = table.positions[:, :, None]  # [B, T, 1]
  num_blocks = jnp.minimum(jnp.max(table.positions) // span + 1, width // block_pages)
  keys_of = "kbsd" if heads_first else "bskd"

  def gather(pages_array, pages):  # this block's keys / values: [KVH, B, S, hd] or [B, S, KVH, hd]
    if heads_first and layer is not None:  # [L, KVH, N, page, hd] -> [B, bp, KVH, page, hd] -> heads first
      return pages_array[layer, :, pages].transpose(2, 0, 1, 3, 4).reshape(kvh, b, span, hd).astype(dtype)
    if heads_first:
      return pages_array[:, pages].reshape(kvh, b, span, hd).astype(dtype)
    if layer is not None:
      return pages_array[layer, pages].reshape(b, span, kvh, hd).astype(dtype)
    return pages_array[pages].reshape(b, span, kvh, hd).astype(dtype)

  def body(i, carry):
    m, l, acc = carry
    pages = jax.lax.dynamic_slice_in_dim(table.block_tables, i * block_pages, block_pages, axis=1)
    keys, values = gather(k_pages, pages), gather(v_pages, pages)
    scores = jnp.einsum(f"btkgd,{keys_of}->bkgts", q, keys, precision=precision).astype(jnp.float32)
    allowed = (i * span + jnp.arange(span))[None, None, :] <= positions  # [B, T, S]
    scores = jnp.where(allowed[:, None, None], scores, -jnp.inf)
    m_new = jnp.maximum(m, scores.max(-1))  # block 0 always holds position 0: finite from the first block
    scale = jnp.exp(m - m_new)
    p = jnp.exp(scores - m_new[..., None])
    l = l * scale + p.sum(-1)
    acc = acc * scale[..., None] + jnp.einsum(f"bkgts,{keys_of}->bkgtd", p.astype(dtype), values, precision=precision)
    return m_new, l, acc

  init = (
    jnp.full((b, kvh, g, t), -jnp.inf, jnp.float32),
    jnp.zeros((b, kvh, g, t), jnp.float32),
    jnp.zeros((b, kvh, g, t, hd), jnp.float32),
  )
  _, l, acc = jax.lax.fori_loop(0, num_blocks, body, init)
  out = acc / l[..., None]  # [B, KVH, G, T, hd]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h * hd)
