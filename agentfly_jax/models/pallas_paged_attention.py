"""Decode steps over the paged KV cache through the Pallas TPU paged-attention kernel of
`jax.experimental.pallas.ops.tpu.paged_attention` (attention_impl "pallas"; models/paged_attention.py has the
cache, its layouts and the XLA path every other call takes).

    out = pallas_paged_decode(q, k_pages, v_pages, table)   # q [B, 1, H, hd], pages [KVH, N, page, hd]

What the kernel takes (jax 0.10.2, paged_attention_kernel.py): q [B, H, hd], unscaled (it computes q . k
with no 1 / sqrt(hd)); k / v pages [KVH, N, page, hd] (the cache's heads-first layout: no transpose per
step); lengths int32[B] (keys 0..length-1 are read); page indices int32[B, P] with P a multiple of
pages_per_compute_block (the engine's block tables are: their width is a multiple of block_pages, used for
both). It DMAs pages_per_compute_block pages of one kv head at a time into VMEM and reads them as bfloat16.
megacore_mode splits the grid over a megacore chip's two TensorCores (v4, v5p); on one-core chips it
must stay None (the kernel's docstring: it may hang otherwise).

The kernel body is called through our own `pallas_call` (`_paged_attention`): the installed wrapper gives the
kernel's running max / sum outputs the shape [B, H, (1,) 1] but q's block spec (last dim head_dim), which
Mosaic refuses ("the last two dimensions of your block shape are divisible by 8 and 128 ... or be equal to
the respective dimensions of the overall array"); here they are q-shaped, as the block spec and the kernel's
stores of [groups, head_dim] tiles expect. Inputs, grid, scratch and the kernel are otherwise the wrapper's
(unquantized pages, inline_seq_dim=True).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from agentfly_jax.models.paged_attention import PageTable
from agentfly_jax.models.sharding import active_mesh_specs

MEGACORE_KINDS = ("TPU v4", "TPU v5")  # device_kind of chips with two TensorCores run as one device ("TPU v5": v5p)


def megacore_mode(device_kind: str, kv_heads: int, batch: int) -> str | None:
  """The kernel's `megacore_mode` for a chip: on a megacore chip (v4, v5p) split the grid over its two
  TensorCores by kv head when this shard has an even number of them, else by batch row when even; None on
  one-core chips (v5e "TPU v5 lite", v6e)."""
  if device_kind not in MEGACORE_KINDS:
    return None
  if kv_heads % 2 == 0:
    return "kv_head"
  return "batch" if batch % 2 == 0 else None


def _paged_attention(
  q, k_pages, v_pages, lengths, page_indices, layer=None, *, pages_per_compute_block: int, megacore_mode
):
  """The kernel on q [B, H, hd] (unscaled), pages [KVH, N, page, hd] (with `layer`, an int32 scalar: every
  layer's [L, KVH, N, page, hd], layer `layer` read in place), lengths int32[B], page_indices int32[B, P].
  Returns [B, H, hd] in q's dtype."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import tpu as pltpu
  from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as pak

  b, h, hd = q.shape
  kvh, _, page_size, _ = k_pages.shape[-4:]
  pages_per_sequence = page_indices.shape[1]
  if pages_per_sequence % pages_per_compute_block:
    raise ValueError(f"{pages_per_sequence} pages a row is not a multiple of {pages_per_compute_block} a block")
  if h % kvh:
    raise ValueError(f"{h} query heads are not a multiple of {kvh} kv heads")
  cores = 1 if megacore_mode is None else 2
  if (megacore_mode == "kv_head" and kvh % 2) or (megacore_mode == "batch" and b % 2):
    raise ValueError(f"megacore_mode={megacore_mode!r} needs an even count (kv heads {kvh}, rows {b})")
  groups = h // kvh
  out_dtype = q.dtype
  if groups % 8:  # the wrapper's hint for a <1x128> layout: q as [B, H, 1, hd] float32
    q = q.reshape(b, h, 1, hd).astype(jnp.float32)
    block, tail = (None, groups, None, hd), (0, 0)
  else:
    block, tail = (None, groups, hd), (0,)
  if megacore_mode == "kv_head":
    index = lambda core, i, j, *_: (i, j * cores + core, *tail)  # noqa: E731
  elif megacore_mode == "batch":
    index = lambda core, i, j, *_: (i * cores + core, j, *tail)  # noqa: E731
  else:
    index = lambda core, i, j, *_: (i, j, *tail)  # noqa: E731
  q_spec = pl.BlockSpec(block, index)
  grid = (cores, b // cores if megacore_mode == "batch" else b, kvh // cores if megacore_mode == "kv_head" else kvh)
  # two buffers a block of pages: the next block is copied in while this one is read
  buffer = lambda pages: pltpu.VMEM((2, pages_per_compute_block, page_size, hd), pages.dtype)  # noqa: E731
  kernel = functools.partial(
    pak.paged_flash_attention_kernel_inline_seq_dim,
    pages_per_sequence=pages_per_sequence,
    batch_size=b,
    pages_per_compute_block=pages_per_compute_block,
    mask_value=pak.DEFAULT_MASK_VALUE,
    attn_logits_soft_cap=None,
    megacore_mode=megacore_mode,
  )
  prefetch = [lengths, page_indices.reshape(-1), jnp.zeros((1,), jnp.int32), jnp.ones((1,), jnp.int32)]
  if layer is not None:  # the layer's pages as views of the stacked arrays (their DMAs read them in place)
    inner = kernel

    def kernel(layer_ref, *refs):
      refs = list(refs)
      refs[5], refs[7] = refs[5].at[layer_ref[0]], refs[7].at[layer_ref[0]]  # k / v pages (HBM refs)
      return inner(*refs)

    prefetch.insert(0, jnp.reshape(layer, (1,)).astype(jnp.int32))
  stats = jax.ShapeDtypeStruct(q.shape, jnp.float32)  # running max / sum, broadcast over head_dim
  out, _, _ = pl.pallas_call(
    kernel,
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=len(prefetch),  # (layer,) lengths, page indices, buffer index, init flag
      in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY), None, pl.BlockSpec(memory_space=pl.ANY), None],
      out_specs=[q_spec, q_spec, q_spec],
      grid=grid,
      scratch_shapes=(
        buffer(k_pages),
        None,
        buffer(v_pages),
        None,
        pltpu.SemaphoreType.DMA((2,)),
        pltpu.SemaphoreType.DMA((2,)),
      ),
    ),
    compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),
    out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), stats, stats],
  )(*prefetch, q, k_pages, None, v_pages, None)
  return out.reshape(b, h, hd).astype(out_dtype)


def _parts(mesh, axes) -> int:
  """How many shards a PartitionSpec entry (None, a mesh axis or a tuple of them) splits a dim into."""
  if axes is None:
    return 1
  return math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))


def pallas_paged_decode(q, k_pages, v_pages, table: PageTable, *, layer=None, device_kind: str | None = None):
  """One decode step (T = 1) through the Pallas TPU paged-attention kernel, reading pages in place.

  q [B, 1, H, hd] (RoPE applied); k_pages / v_pages [KVH, N, page, hd] (heads first); table: block tables
  int32[B, P] (P a multiple of table.block_pages, the kernel's pages_per_compute_block) and positions int32[B, 1]
  (row b reads its positions 0..positions[b]: length positions + 1; its new key is already written). The kernel
  reads keys / values as bfloat16 (a float32 cache is rounded inside it). On a mesh (`activation_sharding`) it
  runs under `shard_map`: rows split by act_batch, kv heads (and with them their query heads) by act_kv_heads,
  every kv head's pages whole on its shards. `device_kind` picks `megacore_mode` (default: the mesh's devices',
  else the default device's).
  `layer` (an int32 scalar): the pages are the scanned layers' stacked [L, KVH, N, page, hd] and this layer's
  are read in place.
  Returns [B, 1, H * hd] in q's dtype. TPU only (Mosaic), or Pallas' TPU interpret mode.
  """
  b, t, h, hd = q.shape
  if t != 1:
    raise ValueError(f"pallas_paged_decode takes one query token per row, got {t}")
  stacked = layer is not None
  kvh = k_pages.shape[int(stacked)]
  lengths = (table.positions[:, 0] + 1).astype(jnp.int32)
  tables = table.block_tables.astype(jnp.int32)
  pages_axes = (None,) * stacked + ("act_kv_heads", None, None, None)
  active = active_mesh_specs((pages_axes, k_pages.shape), (("act_batch",), (b,)))
  if device_kind is None:
    device_kind = (active[0].devices.flat[0] if active else jax.devices()[0]).device_kind
  shard_b, shard_kvh = b, kvh
  if active is not None:
    mesh, (pages_spec, (rows,)) = active
    shard_b, shard_kvh = b // _parts(mesh, rows), kvh // _parts(mesh, pages_spec[int(stacked)])
  kernel = functools.partial(
    _paged_attention,
    pages_per_compute_block=table.block_pages,
    megacore_mode=megacore_mode(device_kind, shard_kvh, shard_b),
  )
  if active is not None:
    q_spec = P(rows, pages_spec[int(stacked)], None)  # query head i reads kv head i // (H / KVH): split alike
    kernel = jax.shard_map(
      kernel,
      mesh=mesh,
      in_specs=(q_spec, pages_spec, pages_spec, P(rows), P(rows, None)) + ((P(),) if stacked else ()),
      out_specs=q_spec,
      check_vma=False,
    )
  args = (layer,) if stacked else ()
  out = kernel((q[:, 0] / math.sqrt(hd)).astype(q.dtype), k_pages, v_pages, lengths, tables, *args)  # [B, H, hd]
  return out.reshape(b, 1, h * hd).astype(q.dtype)
