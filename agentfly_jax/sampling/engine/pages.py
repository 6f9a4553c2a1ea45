"""The page allocator of the paged KV cache, with prefix sharing: host-side bookkeeping only, no arrays.

    pool = PagePool(num_pages=512, page_size=16)
    hit = pool.match(tokens)                 # cached full pages that hold a prefix of `tokens` (increfs them)
    pages = pool.allocate(3)                 # None when the pool cannot supply 3 (the caller preempts)
    pool.register(tokens, block_table)       # make a sequence's full pages findable by later prompts
    pool.release(pages)                      # decref; unused cached pages stay findable until evicted (LRU)

A page is in exactly one of three states: free, in use (refcount > 0), or cached-idle (refcount 0, still
findable by its content, evicted least recently used first when the free list runs dry). Page 0 is the sink
(models/paged_attention.SINK_PAGE) and never handed out.

Prefix sharing is a trie over full pages: a cached page is found by (its parent's node id, the tuple of its
page_size tokens), so a hit is exact (dict equality, no hash collisions) and covers only whole pages that
start the sequence. A chain's next turn (its last prompt + reply + observation) and the G chains of a GRPO
group (one prompt) find the same pages. Only full pages are shared and a full page is never written again,
so sharing needs no copy: the partial last page of a prompt is each sequence's own.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

from agentfly_jax.models.paged_attention import SINK_PAGE


@dataclasses.dataclass
class _Node:
  """A cached page: its trie key and the node id its children are keyed by."""

  key: tuple
  node_id: int


class PagePool:
  """Pages of one paged KV cache. Not thread-safe: one engine thread owns it."""

  def __init__(self, num_pages: int, page_size: int):
    if num_pages < 2:
      raise ValueError(f"PagePool: need at least 2 pages (page 0 is the sink), got {num_pages}")
    if page_size < 1:
      raise ValueError(f"PagePool: page_size must be >= 1, got {page_size}")
    self.num_pages, self.page_size = int(num_pages), int(page_size)
    self._free = collections.deque(p for p in range(num_pages) if p != SINK_PAGE)
    self._refs = [0] * num_pages
    self._node: dict[int, _Node] = {}  # page -> its trie node (cached pages only)
    self._trie: dict[tuple, int] = {}  # (parent node id, tokens) -> page
    self._idle: collections.OrderedDict[int, None] = collections.OrderedDict()  # cached, refcount 0, LRU first
    self._ids = itertools.count(1)  # node ids; 0 is the root
    self.evictions = 0

  # ------------------------------------------------------------------ queries
  @property
  def capacity(self) -> int:
    """Pages a sequence can ever use (all but the sink)."""
    return self.num_pages - 1

  def available(self) -> int:
    """Pages `allocate` can hand out now (free + cached-idle)."""
    return len(self._free) + len(self._idle)

  def in_use(self) -> int:
    return sum(1 for r in self._refs if r > 0)

  def pages_for(self, num_tokens: int) -> int:
    return -(-num_tokens // self.page_size)

  # ------------------------------------------------------------------ prefix trie
  def _walk(self, tokens, limit_pages: int):
    """The cached pages holding tokens' first whole pages, at most `limit_pages`, and the last node id."""
    ps, parent, pages = self.page_size, 0, []
    for i in range(min(limit_pages, len(tokens) // ps)):
      page = self._trie.get((parent, tuple(tokens[i * ps : (i + 1) * ps])))
      if page is None:
        break
      pages.append(page)
      parent = self._node[page].node_id
    return pages, parent

  def match(self, tokens, limit_pages: int | None = None) -> list[int]:
    """Increfs and returns the cached pages that hold the longest whole-page prefix of `tokens`."""
    pages, _ = self._walk(tokens, len(tokens) if limit_pages is None else limit_pages)
    for page in pages:
      self._ref(page)
    return pages

  def peek(self, tokens, limit_pages: int | None = None) -> int:
    """How many whole pages of `tokens` are cached now (nothing changes)."""
    return len(self._walk(tokens, len(tokens) if limit_pages is None else limit_pages)[0])

  def register(self, tokens, block_table, num_computed: int) -> None:
    """Makes the full pages among the first `num_computed` positions of a sequence (`tokens`, its pages
    `block_table`) findable. A page whose content is already cached under another page stays private."""
    ps, parent = self.page_size, 0
    for i in range(min(num_computed, len(tokens)) // ps):
      key = (parent, tuple(tokens[i * ps : (i + 1) * ps]))
      page = block_table[i]
      found = self._trie.get(key)
      if found is None:
        if page in self._node:  # already cached under another key: cannot happen for full pages; be safe
          return
        node = _Node(key, next(self._ids))
        self._trie[key], self._node[page] = page, node
        found = page
      elif found != page:  # the same content cached in another page: continue the walk from that one
        pass
      parent = self._node[found].node_id

  def invalidate(self) -> None:
    """Forgets every cached page (new weights make old keys / values wrong): idle ones become free."""
    self._trie.clear()
    self._node.clear()
    self._free.extend(self._idle)
    self._idle.clear()

  # ------------------------------------------------------------------ allocation
  def _ref(self, page: int) -> None:
    if self._refs[page] == 0:
      self._idle.pop(page, None)
    self._refs[page] += 1

  def allocate(self, n: int) -> list[int] | None:
    """n fresh pages (refcount 1), or None (nothing taken) if the pool has fewer available."""
    if n > self.available():
      return None
    out = []
    for _ in range(n):
      if self._free:
        page = self._free.popleft()
      else:  # evict the least recently used idle cached page
        page, _ = self._idle.popitem(last=False)
        node = self._node.pop(page)
        del self._trie[node.key]
        self.evictions += 1
      self._refs[page] = 1
      out.append(page)
    return out

  def release(self, pages) -> None:
    """Decrefs `pages`; a page no one uses becomes cached-idle (if cached) or free."""
    for page in pages:
      if self._refs[page] <= 0:
        raise RuntimeError(f"PagePool: page {page} released more often than taken")
      self._refs[page] -= 1
      if self._refs[page] == 0:
        if page in self._node:
          self._idle[page] = None
        else:
          self._free.append(page)

  def check(self) -> None:
    """Asserts the invariants (tests): every page but the sink in exactly one state."""
    free, idle = set(self._free), set(self._idle)
    used = {p for p, r in enumerate(self._refs) if r > 0}
    assert len(free) == len(self._free), "a page is free twice"
    assert not (free & idle) and not (free & used) and not (idle & used), "a page in two states"
    assert free | idle | used == set(range(self.num_pages)) - {SINK_PAGE}, "a page leaked or the sink was handed out"
    assert idle <= set(self._node), "an idle page that is not cached"
    assert all(self._trie[n.key] == p for p, n in self._node.items()), "the trie and the nodes disagree"
