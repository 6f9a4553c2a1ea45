"""KVCache: per-layer key/value buffers for incremental decoding (a registered JAX pytree)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Key/value buffers, one pair per decoder layer.

  Attributes:
    k: tuple of num_layers arrays [B, num_kv_heads, max_len, head_dim].
    v: tuple of num_layers arrays [B, num_kv_heads, max_len, head_dim].

  Which slots are valid is tracked by the caller (`kv_mask bool[B, max_len]`), and where to
  write by `cache_index`; the cache itself is only the buffers, so it passes through `jax.jit`
  (donate it to update in place).
  """
  k: tuple
  v: tuple

  @classmethod
  def zeros(cls, num_layers: int, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int,
            dtype=jnp.float32) -> "KVCache":
    shape = (batch_size, num_kv_heads, max_len, head_dim)
    return cls(k=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
               v=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)))

  @property
  def num_layers(self) -> int:
    return len(self.k)

  @property
  def batch_size(self) -> int:
    return self.k[0].shape[0]

  @property
  def max_len(self) -> int:
    return self.k[0].shape[2]
