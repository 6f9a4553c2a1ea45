"""KVCache: per-layer key/value buffers for incremental decoding (a registered JAX pytree)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Key/value buffers, one pair per decoder layer, with (batch row, kv head) pairs folded.

  Attributes:
    k: tuple of num_layers arrays [B * num_kv_heads, head_dim, max_len] (keys transposed), or
      (`stacked`, the scanned model's cache) one array [num_layers, B * num_kv_heads, head_dim, max_len].
    v: the same of [B * num_kv_heads, max_len, head_dim] (stacked: [num_layers, ...]).
    num_kv_heads: static.

  With this layout both attention products of a decode step (q @ K and probs @ V) are plain 3-D
  batched matmuls straight on the updated buffers, which XLA's CPU backend runs without copying
  or transposing the cache. `keys(i)` / `values(i)` give layer i as [B, KVH, S, hd].

  Which slots are valid is tracked by the caller (`kv_mask bool[B, max_len]`), and where to
  write by `cache_index`; the cache itself is only the buffers, so it passes through `jax.jit`
  (donate it to update in place).
  """

  k: tuple
  v: tuple
  num_kv_heads: int = dataclasses.field(metadata=dict(static=True))

  @classmethod
  def zeros(
    cls,
    num_layers: int,
    batch_size: int,
    max_len: int,
    num_kv_heads: int,
    head_dim: int,
    dtype=jnp.float32,
    *,
    stacked: bool = False,
  ) -> "KVCache":
    """Zero buffers; `stacked`: one [num_layers, ...] array each for k and v (scanned layers)."""
    rows = batch_size * num_kv_heads
    if stacked:
      return cls(
        k=jnp.zeros((num_layers, rows, head_dim, max_len), dtype),
        v=jnp.zeros((num_layers, rows, max_len, head_dim), dtype),
        num_kv_heads=num_kv_heads,
      )
    return cls(
      k=tuple(jnp.zeros((rows, head_dim, max_len), dtype) for _ in range(num_layers)),
      v=tuple(jnp.zeros((rows, max_len, head_dim), dtype) for _ in range(num_layers)),
      num_kv_heads=num_kv_heads,
    )

  @property
  def stacked(self) -> bool:
    """True when k / v are single [num_layers, ...] arrays (the scanned model's layout)."""
    return not isinstance(self.k, (tuple, list))

  @property
  def num_layers(self) -> int:
    return len(self.k)

  @property
  def batch_size(self) -> int:
    return self.v[0].shape[0] // self.num_kv_heads

  @property
  def max_len(self) -> int:
    return self.v[0].shape[1]

  def keys(self, layer: int) -> jax.Array:
    """Layer `layer`'s keys as [B, KVH, max_len, head_dim]."""
    k = self.k[layer]
    return k.reshape(self.batch_size, self.num_kv_heads, *k.shape[1:]).swapaxes(2, 3)

  def values(self, layer: int) -> jax.Array:
    """Layer `layer`'s values as [B, KVH, max_len, head_dim]."""
    v = self.v[layer]
    return v.reshape(self.batch_size, self.num_kv_heads, *v.shape[1:])
