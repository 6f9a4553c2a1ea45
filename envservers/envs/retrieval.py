"""`retrieval`: BM25 search (bm25s) over a JSONL corpus, one index per server process.

Serve it with `python -m envservers --env retrieval=16 [--env-opt retrieval.corpus=PATH.jsonl]
[--env-opt retrieval.k=3]`. The corpus has one JSON object per line: {"id": str, "title": str,
"text": str} (a `.jsonl.gz` file works too); the default is the generated multi-hop knowledge base
shipped in envservers/data/ (agentfly_jax.tasks.multihop_kb writes it).

- One index per process: every instance of the pool (and every pool naming the same corpus)
  shares one `BM25Index`, built or loaded on the first construction; a bad corpus line stops the
  server at start-up with the file and line number.
- Cached on disk under `cache_dir` (default $AGENTFLY_CACHE_DIR/bm25 or ~/.cache/agentfly_jax/bm25)
  in a folder named by the corpus's sha256, so a restart loads the index instead of rebuilding it.
- A step action is a query string, or {"query": str, "k": int} (also as JSON text); the
  observation lists the top-k passages, numbered, with their titles. A bad action (empty query,
  k out of range, malformed JSON) gets an observation saying what was wrong, never an exception.
"""

from __future__ import annotations

import collections.abc
import gzip
import hashlib
import json
import mmap
import os
import shutil
import sys
import tempfile
import threading
from typing import Any

import numpy as np

from envservers.env import ServerEnv, StepOutcome
from envservers.registry import register_env

DEFAULT_CORPUS = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "multihop_kb.jsonl.gz"
)
MAX_K = 50
MAX_QUERY_CHARS = 2000
_INDEX_FORMAT = "bm25s-v2"  # bump when the cached layout or the tokenization changes


class CorpusError(ValueError):
  """The corpus file cannot be used (the message names the file and line)."""


def import_bm25s():
  """bm25s, imported with its optional JAX and numba back-ends switched off.

  bm25s imports JAX (for top-k) and numba when they are installed; an env server never imports
  JAX (it stays light and starts fast), and numpy's top-k is what we use anyway.
  """
  if "bm25s" in sys.modules:
    return sys.modules["bm25s"]
  blocked = {name: sys.modules.get(name, ...) for name in ("jax", "numba")}
  try:
    for name in blocked:
      sys.modules[name] = None  # makes `import jax` raise ImportError inside bm25s
    os.environ.setdefault("DISABLE_TQDM", "1")
    import bm25s
  finally:
    for name, module in blocked.items():
      if module is ...:
        sys.modules.pop(name, None)
      else:
        sys.modules[name] = module
  return bm25s


def corpus_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _open_text(path: str):
  return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")


def load_corpus(path: str) -> list[dict]:
  """The passages of a JSONL corpus; raises CorpusError naming the file and line of a bad one."""
  if not os.path.isfile(path):
    raise CorpusError(f"retrieval corpus {path!r} does not exist")
  docs, seen = [], {}
  try:
    with _open_text(path) as f:
      for lineno, line in enumerate(f, 1):
        if not line.strip():
          continue
        where = f"retrieval corpus {path}, line {lineno}"
        try:
          doc = json.loads(line)
        except ValueError as e:
          raise CorpusError(f"{where}: not valid JSON ({e})") from None
        if not isinstance(doc, dict):
          raise CorpusError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        for field in ("id", "title", "text"):
          if not isinstance(doc.get(field), str):
            raise CorpusError(f"{where}: field {field!r} must be a string, got {doc.get(field)!r:.60}")
        if not doc["text"].strip():
          raise CorpusError(f"{where}: field 'text' is empty")
        if doc["id"] in seen:
          raise CorpusError(f"{where}: id {doc['id']!r} already used on line {seen[doc['id']]}")
        seen[doc["id"]] = lineno
        docs.append({"id": doc["id"], "title": doc["title"], "text": doc["text"]})
  except (OSError, EOFError, UnicodeDecodeError) as e:
    raise CorpusError(f"retrieval corpus {path!r} cannot be read: {type(e).__name__}: {e}") from None
  if not docs:
    raise CorpusError(f"retrieval corpus {path!r} has no passages")
  return docs


def default_cache_dir() -> str:
  root = os.environ.get("AGENTFLY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "agentfly_jax")
  return os.path.join(root, "bm25")


def _tokenize(bm25s, texts: list[str], **kwargs):
  return bm25s.tokenize(texts, stopwords="en", show_progress=False, **kwargs)


class PassageFile(collections.abc.Sequence):
  """Passages stored as JSON lines + an offsets array, memory-mapped: loading costs nothing and
  a passage is decoded only when a query returns it (one copy, in the page cache)."""

  def __init__(self, stem: str):
    self._offsets = np.load(stem + ".offsets.npy", mmap_mode="r")
    with open(stem + ".jsonl", "rb") as f:
      self._data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

  @staticmethod
  def write(stem: str, docs) -> None:
    offsets = [0]
    with open(stem + ".jsonl", "wb") as f:
      for doc in docs:
        line = (json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8")
        f.write(line)
        offsets.append(offsets[-1] + len(line))
    np.save(stem + ".offsets.npy", np.asarray(offsets, dtype=np.int64))

  def __len__(self) -> int:
    return len(self._offsets) - 1

  def __getitem__(self, i: int) -> dict:
    if not -len(self) <= i < len(self):
      raise IndexError(i)
    i %= len(self)
    return json.loads(self._data[int(self._offsets[i]) : int(self._offsets[i + 1])])


class BM25Index:
  """A bm25s index over passages {"id", "title", "text"} (title and text are both indexed).

  Attributes:
    docs: the passages, in index order.
    sha256: the corpus file's hash (the cache key).
    source: "built" or "cache" (how this process got it).
  """

  def __init__(self, docs: list[dict], retriever, sha256: str, source: str):
    self.docs = docs
    self.retriever = retriever
    self.sha256 = sha256
    self.source = source
    self._bm25s = import_bm25s()

  @classmethod
  def build(cls, docs: list[dict], sha256: str = "") -> "BM25Index":
    bm25s = import_bm25s()
    retriever = bm25s.BM25()
    retriever.index(_tokenize(bm25s, [f"{d['title']} {d['text']}" for d in docs]), show_progress=False)
    return cls(docs, retriever, sha256, "built")

  def save(self, folder: str) -> None:
    """Writes the index and the passages into `folder` (atomically: a temp folder, renamed)."""
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
      self.retriever.save(tmp, show_progress=False)
      PassageFile.write(os.path.join(tmp, "passages"), self.docs)
      with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump({"format": _INDEX_FORMAT, "sha256": self.sha256, "num_docs": len(self.docs)}, f)
      try:
        os.rename(tmp, folder)
      except OSError:  # another process saved it first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise

  @classmethod
  def load(cls, folder: str) -> "BM25Index":
    bm25s = import_bm25s()
    with open(os.path.join(folder, "meta.json")) as f:
      meta = json.load(f)
    if meta.get("format") != _INDEX_FORMAT:
      raise ValueError(f"index cache {folder} has format {meta.get('format')!r}")
    docs = PassageFile(os.path.join(folder, "passages"))
    retriever = bm25s.BM25.load(folder, show_progress=False, mmap=True)
    return cls(docs, retriever, meta["sha256"], "cache")

  def search(self, query: str, k: int) -> list[tuple[dict, float]]:
    """The top `k` passages for `query` with their BM25 scores, best first (none if no query
    word is in the corpus)."""
    k = max(1, min(int(k), len(self.docs)))
    tokens = _tokenize(self._bm25s, [query], return_ids=False)[0]
    ids = self.retriever.get_tokens_ids(tokens)
    if not ids:
      return []
    scores = self.retriever.get_scores_from_ids(ids)
    # Only matching passages (argpartition over ~all-zero scores degrades to ~30 ms at 100k).
    candidates = np.flatnonzero(scores > 0)
    if len(candidates) > k:
      candidates = candidates[np.argpartition(-scores[candidates], k - 1)[:k]]
    ranked = sorted(candidates.tolist(), key=lambda i: (-scores[i], i))
    return [(self.docs[i], float(scores[i])) for i in ranked]


_indexes: dict[tuple, BM25Index] = {}
_indexes_lock = threading.Lock()


def shared_index(corpus: str, cache_dir: str | None = None) -> BM25Index:
  """The process-wide index of `corpus`: from memory, else the disk cache, else built (and cached).

  Keyed in memory by the file's path, size and modification time, on disk by its sha256.
  Raises CorpusError naming the file and line of a bad passage.
  """
  path = os.path.abspath(corpus)
  try:
    stat = os.stat(path)
  except OSError:
    raise CorpusError(f"retrieval corpus {corpus!r} does not exist") from None
  key = (path, stat.st_size, stat.st_mtime_ns)
  with _indexes_lock:
    if key in _indexes:
      return _indexes[key]
    sha = corpus_sha256(path)
    folder = os.path.join(cache_dir or default_cache_dir(), sha)
    index = None
    if os.path.isfile(os.path.join(folder, "meta.json")):
      try:
        index = BM25Index.load(folder)
      except Exception as e:  # noqa: BLE001 -- a damaged cache is rebuilt, not fatal
        print(
          f"envservers: retrieval index cache {folder} unusable ({type(e).__name__}: {e}); rebuilding", file=sys.stderr
        )
        shutil.rmtree(folder, ignore_errors=True)
    if index is None:
      index = BM25Index.build(load_corpus(path), sha)
      try:
        index.save(folder)
      except OSError as e:
        print(f"envservers: could not cache the retrieval index in {folder}: {e}", file=sys.stderr)
    _indexes[key] = index
    return index


def parse_action(action: Any, default_k: int, max_k: int) -> tuple[str, int]:
  """(query, k) from a step action; raises ValueError with a message for the model."""
  if isinstance(action, str) and action.lstrip().startswith("{"):
    try:
      action = json.loads(action)
    except ValueError as e:
      raise ValueError(
        f"the action looks like JSON but does not parse ({e}); send a query string or {{\"query\": str, \"k\": int}}"
      ) from None
  k = default_k
  if isinstance(action, dict):
    unknown = sorted(set(action) - {"query", "k"})
    if unknown:
      raise ValueError(f"unknown field(s) {unknown} in the action; expected {{\"query\": str, \"k\": int}}")
    k = action.get("k", default_k)
    action = action.get("query")
  if not isinstance(action, str):
    raise ValueError(f"the query must be a string, got {type(action).__name__}")
  query = action.strip()
  if not query:
    raise ValueError("the query is empty; write a few words to search for")
  if len(query) > MAX_QUERY_CHARS:
    raise ValueError(f"the query is too long ({len(query)} characters > {MAX_QUERY_CHARS})")
  if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= max_k:
    raise ValueError(f"k must be an integer from 1 to {max_k}, got {k!r}")
  return query, k


def format_results(results: list[tuple[dict, float]]) -> str:
  """Numbered passages with their titles: '[1] Title\\ntext' blocks separated by blank lines."""
  return "\n\n".join(f"[{i}] {doc['title']}\n{doc['text']}" for i, (doc, _) in enumerate(results, 1))


@register_env
class RetrievalEnv(ServerEnv):
  """Options (`--env-opt retrieval.NAME=VALUE`):
  corpus: JSONL(.gz) path (default: the shipped multi-hop knowledge base).
  k: passages per query when the action does not say (default 3).
  max_k: the largest k an action may ask for (default 20, at most 50).
  cache_dir: where indexes are cached (default $AGENTFLY_CACHE_DIR/bm25).
  """

  name = "retrieval"
  reusable = True
  call_timeout_s = 30.0

  def __init__(self, corpus: str = DEFAULT_CORPUS, k: int = 3, max_k: int = 20, cache_dir: str | None = None):
    if not isinstance(corpus, str) or not corpus:
      raise ValueError(f"retrieval option 'corpus' must be a file path, got {corpus!r}")
    for key, value, top in (("max_k", max_k, MAX_K), ("k", k, max_k)):
      if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
        raise ValueError(f"retrieval option {key!r} must be an integer from 1 to {top}, got {value!r}")
    self.index = shared_index(corpus, cache_dir)  # once per process; later calls are a lookup
    self.max_k = min(max_k, len(self.index.docs))
    self.k = min(k, self.max_k)
    self.num_queries = 0

  async def reset(self, row):
    self.num_queries = 0
    return ""

  async def step(self, action: Any) -> StepOutcome:
    try:
      query, k = parse_action(action, self.k, self.max_k)
    except ValueError as e:
      return StepOutcome(observation=f"Error: {e}", info={"error": "BadAction"})
    self.num_queries += 1
    results = self.index.search(query, k)
    if not results:
      return StepOutcome(observation=f"No passage matches {query!r}.", info={"ids": [], "scores": [], "error": None})
    return StepOutcome(
      observation=format_results(results),
      info={"ids": [d["id"] for d, _ in results], "scores": [s for _, s in results], "error": None},
    )
