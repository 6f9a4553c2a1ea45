"""PrefixStore: the JAX sampler's cache of computed keys / values across calls (multi-turn chains).

    store = PrefixStore(max_tokens=32768)
    hit = store.lookup(prompt)                    # the longest stored prefix of `prompt`, or None
    batch = cached_batch(hits, prompts, ...)      # a KVCache holding each row's prefix + the suffixes
    store.insert(tokens, k, v)                    # a finished row: its prompt + fed tokens' KV

A chain's next prompt is its last prompt + the reply + the tool's observation (token-in /
token-out), so all but the new tokens were computed on the last call. The store keeps, per
finished row, the tokens whose keys / values the decode wrote (the prompt and every generated
token but the last, which was sampled and never fed) with those keys / values, on the host; the
next call that starts with them prefills only its suffix (`decode.generate_rows_from_cache`).

A prompt may also share only a start with an entry (another chain's turn after the same system
prompt and task): the common prefix is reused. The keys / values belong to the weights that
computed them: the sampler clears the store on every weight update. Memory: `max_tokens` stored tokens at most (least recently used entries go first;
an entry is also dropped when a longer one that starts with it is stored, so a chain keeps one
entry); a token costs num_layers x 2 x num_kv_heads x head_dim x the cache dtype's bytes
(SmolLM2-135M in float32: 46 KB). Numbers: the reused keys / values were computed in another
batch shape, so log-probs match a full prefill to float rounding (the tests bound it), as with
vLLM's prefix caching.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Sequence

import numpy as np

from agentfly_jax.models.kv_cache import KVCache


@dataclasses.dataclass(eq=False)  # entries compare by identity
class PrefixEntry:
  """One row's computed prefix: tokens int32[L], k [num_layers, KVH, hd, L], v [num_layers, KVH, L, hd]."""

  tokens: np.ndarray
  k: np.ndarray
  v: np.ndarray
  last_used: int = 0

  def __len__(self) -> int:
    return len(self.tokens)


@dataclasses.dataclass(frozen=True)
class PrefixHit:
  """`length` leading tokens of a prompt whose keys / values `entry` holds (length <= len(prompt) - 1:
  the prompt's last token is always prefilled, for its logits)."""

  entry: PrefixEntry
  length: int


@dataclasses.dataclass
class PrefixStats:
  """Counts since the sampler was built: prompts looked up, those that found a stored prefix,
  prompt tokens whose keys / values were reused and prompt tokens prefilled (the two add up to
  every prompt token generated from), entries dropped for memory."""

  lookups: int = 0
  hits: int = 0
  reused_tokens: int = 0
  prefilled_tokens: int = 0
  evicted: int = 0


class PrefixStore:
  """Least-recently-used store of computed prefixes, `max_tokens` tokens in all (see the module doc).

  `min_hit`: a stored prefix shorter than this is not worth a separate suffix program; such
  prompts are prefilled whole.
  """

  def __init__(self, max_tokens: int, *, min_hit: int = 32):
    if max_tokens < 1:
      raise ValueError(f"PrefixStore: max_tokens must be >= 1, got {max_tokens}")
    self.max_tokens = int(max_tokens)
    self.min_hit = int(min_hit)
    self.entries: list[PrefixEntry] = []
    self.stats = PrefixStats()
    self.epoch = 0  # bumped by clear(): an insert computed before it is dropped
    self._clock = 0
    self._lock = threading.Lock()  # clear() may come from another thread (async weight sync)

  @property
  def tokens(self) -> int:
    return sum(len(e) for e in self.entries)

  def clear(self) -> None:
    """Forget every entry (the weights changed)."""
    with self._lock:
      self.epoch += 1
      self.entries = []

  def lookup(self, prompt: Sequence[int]) -> PrefixHit | None:
    """The stored entry sharing the longest common prefix with `prompt` (at least `min_hit`
    tokens, at most len(prompt) - 1), or None."""
    self.stats.lookups += 1
    prompt = np.asarray(prompt, np.int32)
    best, best_len = None, 0
    for entry in list(self.entries):
      m = min(len(entry), len(prompt) - 1)
      same = entry.tokens[:m] == prompt[:m]
      n = m if same.all() else int(np.argmin(same))  # the common prefix (a shared system prompt counts)
      if n > best_len and n >= self.min_hit:
        best, best_len = entry, n
    if best is None:
      return None
    self._clock += 1
    best.last_used = self._clock
    self.stats.hits += 1
    return PrefixHit(best, best_len)

  def insert(self, tokens: np.ndarray, k: np.ndarray, v: np.ndarray, *, epoch: int | None = None) -> None:
    """Stores a row's computed prefix; drops the entries it extends, then the least recently used
    ones while over `max_tokens` (an entry longer than `max_tokens` is not stored). `epoch`: the
    store's epoch when the batch started; a batch that ran across a clear() stores nothing."""
    if len(tokens) < self.min_hit or len(tokens) > self.max_tokens:
      return
    with self._lock:
      if epoch is None or epoch == self.epoch:
        self._insert(tokens, k, v)

  def _insert(self, tokens: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    self._clock += 1
    self.entries = [
      e for e in self.entries if not (len(e) <= len(tokens) and np.array_equal(e.tokens, tokens[: len(e)]))
    ]
    self.entries.append(PrefixEntry(np.asarray(tokens, np.int32), k, v, self._clock))
    total = self.tokens
    while total > self.max_tokens:
      oldest = min(self.entries, key=lambda e: e.last_used)
      self.entries = [e for e in self.entries if e is not oldest]
      total -= len(oldest)
      self.stats.evicted += 1


@dataclasses.dataclass(frozen=True)
class CachedBatch:
  """Host arrays for `decode.generate_rows_from_cache` (B rows, P prompt slots, U suffix slots,
  N new-token slots): k / v [num_layers, B * KVH, hd, P + N] / [num_layers, B * KVH, P + N, hd],
  kv_mask bool[B, P + N], suffix_ids / suffix_positions int32[B, U]."""

  k: np.ndarray
  v: np.ndarray
  kv_mask: np.ndarray
  suffix_ids: np.ndarray
  suffix_positions: np.ndarray

  def kv_cache(self, stacked: bool) -> KVCache:
    """The model's KVCache (per-layer tuples unless `stacked`) as device arrays, copied from
    these host arrays (drop the CachedBatch after: its k / v are the largest host copy)."""
    import jax

    kvh = self.k.shape[1] // self.kv_mask.shape[0]
    if stacked:
      return KVCache(k=jax.device_put(self.k), v=jax.device_put(self.v), num_kv_heads=kvh)
    return KVCache(
      k=tuple(jax.device_put(x) for x in self.k), v=tuple(jax.device_put(x) for x in self.v), num_kv_heads=kvh
    )


def cached_batch(
  hits: Sequence[PrefixHit],
  prompts: Sequence[Sequence[int]],
  *,
  batch: int,
  prompt_slots: int,
  suffix_slots: int,
  new_slots: int,
  pad_id: int,
) -> CachedBatch:
  """Lays out rows for a suffix prefill: row i's cached prefix (hits[i].length tokens, cut to
  P - U when longer) ends at slot P - U, its remaining prompt tokens are right-aligned in
  [P - U, P), decoding writes from P. Rows past len(prompts) are padding (nothing valid).
  Needs every prompt to fit P and every suffix (after the cut) to fit U."""
  first = hits[0].entry
  num_layers, kvh, hd = first.k.shape[0], first.k.shape[1], first.k.shape[2]
  p, u, n = prompt_slots, suffix_slots, new_slots
  k = np.zeros((num_layers, batch * kvh, hd, p + n), first.k.dtype)
  v = np.zeros((num_layers, batch * kvh, p + n, hd), first.v.dtype)
  kv_mask = np.zeros((batch, p + n), bool)
  kv_mask[:, p:] = True
  suffix_ids = np.full((batch, u), pad_id, np.int32)
  suffix_positions = np.zeros((batch, u), np.int32)
  for i, (hit, prompt) in enumerate(zip(hits, prompts)):
    c = min(hit.length, p - u)
    tail = np.asarray(prompt[c:], np.int32)
    if len(prompt) > p or len(tail) > u or c < 1:
      raise ValueError(f"cached_batch: row {i} ({len(prompt)} tokens, {c} cached) does not fit P={p}, U={u}")
    rows = slice(i * kvh, (i + 1) * kvh)
    k[:, rows, :, p - u - c : p - u] = hit.entry.k[..., :c]
    v[:, rows, p - u - c : p - u, :] = hit.entry.v[:, :, :c, :]
    kv_mask[i, p - u - c : p - u] = True
    kv_mask[i, p - len(tail) : p] = True
    suffix_ids[i, u - len(tail) :] = tail
    suffix_positions[i, u - len(tail) :] = c + np.arange(len(tail), dtype=np.int32)
  return CachedBatch(k, v, kv_mask, suffix_ids, suffix_positions)


def computed_rows(
  cache: KVCache, kv_mask: np.ndarray, prompts: Sequence[Sequence[int]], new_tokens: Sequence[Sequence[int]], p_len: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(tokens, k, v) per row of a finished batch: the prompt and the new tokens that were fed
  (all but the last), with their keys / values gathered from the cache's valid slots (row by
  row and layer by layer: no host copy of the whole cache)."""
  layers_k = [np.asarray(x) for x in (cache.k if not cache.stacked else [cache.k[i] for i in range(cache.k.shape[0])])]
  layers_v = [np.asarray(x) for x in (cache.v if not cache.stacked else [cache.v[i] for i in range(cache.v.shape[0])])]
  kvh = cache.num_kv_heads
  out = []
  for i, (prompt, new) in enumerate(zip(prompts, new_tokens)):
    fed = max(len(new) - 1, 0)
    slots = np.concatenate([np.flatnonzero(kv_mask[i, :p_len]), p_len + np.arange(fed)])
    if len(slots) != len(prompt) + fed:
      raise AssertionError(f"computed_rows: row {i} has {len(slots)} valid slots for {len(prompt) + fed} tokens")
    rows = slice(i * kvh, (i + 1) * kvh)
    tokens = np.concatenate([np.asarray(prompt, np.int32), np.asarray(new[:fed], np.int32)])
    k = np.stack([layer[rows][..., slots] for layer in layers_k])
    v = np.stack([layer[rows][:, slots, :] for layer in layers_v])
    out.append((tokens, k, v))
  return out
