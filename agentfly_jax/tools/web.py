"""`web_search(query, num_results=5)`: web search through a pluggable HTTP JSON backend, cached.

Backend (environment variables, read at each call):
  AGENTFLY_SEARCH_URL       the endpoint (required unless a Python backend is set).
  AGENTFLY_SEARCH_API_KEY   sent as `Authorization: Bearer <key>` when set.
  AGENTFLY_SEARCH_TIMEOUT_S per-request timeout (default 15).
Request: `POST <url>` with JSON `{"query": str, "num_results": int}`.
Response: JSON `{"results": [{"title": str, "url": str, "snippet": str}, ...]}` (extra fields are
ignored; a missing title/url/snippet reads as ""). Put an adapter service in front of a search
API with another shape, or pass a Python backend: `set_search_backend(fn)` with
`fn(query, num_results) -> [{"title", "url", "snippet"}]`.

Cache: identical (backend, query, num_results) requests are answered from a cache: an in-process
LRU by default; redis when AGENTFLY_REDIS_URL is set (shared by processes and restarts; entries
expire after AGENTFLY_SEARCH_CACHE_TTL_S, default 1 day). If redis stops answering, a warning is
issued once and the LRU serves alone; redis is tried again after `retry_s`.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
import warnings
from typing import Callable

from agentfly_jax.tools.tool import tool

_backend: Callable | None = None


def set_search_backend(fn: Callable | None) -> None:
  """Uses `fn(query, num_results) -> [{"title", "url", "snippet"}]` instead of the HTTP backend
  (None: back to AGENTFLY_SEARCH_URL)."""
  global _backend
  _backend = fn


def http_search(
  url: str, query: str, num_results: int, api_key: str | None = None, timeout_s: float = 15.0
) -> list[dict]:
  """One request to an HTTP JSON search backend (the mapping in the module docstring)."""
  headers = {"Content-Type": "application/json", "Accept": "application/json"}
  if api_key:
    headers["Authorization"] = f"Bearer {api_key}"
  body = json.dumps({"query": query, "num_results": num_results}).encode()
  request = urllib.request.Request(url, data=body, headers=headers, method="POST")
  try:
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
      payload = json.loads(response.read().decode("utf-8"))
  except urllib.error.HTTPError as e:
    raise RuntimeError(f"search backend {url} answered HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError) as e:
    raise RuntimeError(f"search backend {url} is unreachable: {e}") from None
  except ValueError:
    raise RuntimeError(f"search backend {url} did not return JSON") from None
  results = payload.get("results") if isinstance(payload, dict) else None
  if not isinstance(results, list):
    raise RuntimeError(f"search backend {url} returned no 'results' list: {str(payload)[:200]}")
  return [{k: str(r.get(k, "") or "") for k in ("title", "url", "snippet")} for r in results if isinstance(r, dict)][
    :num_results
  ]


class SearchCache:
  """A thread-safe LRU, in front of redis when `redis_url` is given (see the module docstring)."""

  def __init__(self, maxsize: int = 4096, redis_url: str | None = None, ttl_s: int = 86400, retry_s: float = 30.0):
    self.maxsize = maxsize
    self.ttl_s = int(ttl_s)
    self.retry_s = retry_s
    self._lru: collections.OrderedDict[str, list] = collections.OrderedDict()
    self._lock = threading.Lock()
    self.redis = None
    self.redis_url = redis_url
    self._redis_down_since: float | None = None
    self._warned = False
    self.hits = collections.Counter()
    if redis_url:
      import redis

      self.redis = redis.Redis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)

  @staticmethod
  def key(*parts) -> str:
    return "agentfly:web_search:" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()

  def _redis_usable(self) -> bool:
    if self.redis is None:
      return False
    if self._redis_down_since is not None and time.monotonic() - self._redis_down_since < self.retry_s:
      return False
    return True

  def _redis_failed(self, error: Exception) -> None:
    self._redis_down_since = time.monotonic()
    if not self._warned:
      self._warned = True
      warnings.warn(
        f"web_search cache: redis at {self.redis_url} failed ({type(error).__name__}: "
        f"{error}); using the in-process LRU cache",
        RuntimeWarning,
        stacklevel=3,
      )

  def get(self, key: str) -> list | None:
    with self._lock:
      if key in self._lru:
        self._lru.move_to_end(key)
        self.hits["lru"] += 1
        return self._lru[key]
    if self._redis_usable():
      import redis

      try:
        raw = self.redis.get(key)
        self._redis_down_since = None
      except redis.exceptions.RedisError as e:
        self._redis_failed(e)
        raw = None
      if raw is not None:
        value = json.loads(raw)
        self._put_lru(key, value)
        self.hits["redis"] += 1
        return value
    self.hits["miss"] += 1
    return None

  def _put_lru(self, key: str, value: list) -> None:
    with self._lock:
      self._lru[key] = value
      self._lru.move_to_end(key)
      while len(self._lru) > self.maxsize:
        self._lru.popitem(last=False)

  def put(self, key: str, value: list) -> None:
    self._put_lru(key, value)
    if self._redis_usable():
      import redis

      try:
        self.redis.set(key, json.dumps(value), ex=self.ttl_s)
        self._redis_down_since = None
      except redis.exceptions.RedisError as e:
        self._redis_failed(e)


_cache: SearchCache | None = None
_cache_lock = threading.Lock()


def default_cache() -> SearchCache:
  """The process-wide cache (redis if AGENTFLY_REDIS_URL is set when first used)."""
  global _cache
  with _cache_lock:
    if _cache is None:
      _cache = SearchCache(
        redis_url=os.environ.get("AGENTFLY_REDIS_URL") or None,
        ttl_s=int(os.environ.get("AGENTFLY_SEARCH_CACHE_TTL_S", "86400")),
      )
    return _cache


def reset_default_cache() -> None:
  """Forgets the process-wide cache (the next search builds one from the environment)."""
  global _cache
  with _cache_lock:
    _cache = None


def search(query: str, num_results: int = 5) -> list[dict]:
  """Cached results for `query` from the configured backend."""
  if not isinstance(query, str) or not query.strip():
    raise ValueError("the query is empty")
  if not isinstance(num_results, int) or not 1 <= num_results <= 20:
    raise ValueError(f"num_results must be an integer from 1 to 20, got {num_results!r}")
  url = os.environ.get("AGENTFLY_SEARCH_URL", "")
  if _backend is None and not url:
    raise RuntimeError(
      "no search backend: set AGENTFLY_SEARCH_URL (an HTTP JSON endpoint) or "
      "call agentfly_jax.tools.web.set_search_backend(fn)"
    )
  backend_name = url if _backend is None else f"python:{getattr(_backend, '__qualname__', _backend)}"
  cache = default_cache()
  key = cache.key(backend_name, query.strip(), num_results)
  results = cache.get(key)
  if results is None:
    if _backend is not None:
      results = list(_backend(query.strip(), num_results))
    else:
      results = http_search(
        url,
        query.strip(),
        num_results,
        api_key=os.environ.get("AGENTFLY_SEARCH_API_KEY") or None,
        timeout_s=float(os.environ.get("AGENTFLY_SEARCH_TIMEOUT_S", "15")),
      )
    cache.put(key, results)
  return results


def format_results(results: list[dict]) -> str:
  if not results:
    return "No results."
  return "\n\n".join(f"[{i}] {r['title']} ({r['url']})\n{r['snippet']}" for i, r in enumerate(results, 1))


@tool(max_length=4096)
def web_search(query: str, num_results: int = 5) -> str:
  """Searches the web and returns the top results, numbered, with title, address and snippet.

  Args:
    query: what to search for.
    num_results: how many results (1 to 20).
  """
  return format_results(search(query, num_results))
