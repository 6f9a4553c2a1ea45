"""The continuous-batching engine: requests enter and leave decode slots at step boundaries.

    engine = Engine(run_prefill, run_decode, config, model_params)   # see PagedJaxSampler for the callables
    future = engine.submit(prompt_ids, sampling_params, seed)        # any thread; future.wait() -> SampleResult
    engine.update_weights(decode_params)                              # lands between steps (mode: drain | recompute)

One engine thread owns the slots, the page pool and the device cache. Each turn of its loop:
  1. a pending weight update lands when its mode allows (drain: once no row runs; recompute: now, every running
     row preempted and re-prefilled on the new weights, keeping the tokens it wrote);
  2. waiting requests are admitted into free slots, first come first served: the longest cached whole-page
     prefix of their tokens is reused (a chain's previous turn, a group's shared prompt) and pages for the rest
     are allocated; a request whose next page another row is prefilling now waits for it (prefilled once);
  3. one prefill chunk (at most R rows x C tokens) runs, so a long prompt never stalls decoding for more than
     one chunk;
  4. one decode block (K steps on device) runs over every decoding slot; rows that stop hand their caller the
     result at once and free their slot and pages (full pages stay cached for the next turn).
When pages run out, the most recently admitted running row is preempted: its pages are released and it
waits at the head of the queue; on resume it prefills prompt + the tokens it wrote (recompute) and continues
with the same random stream, so preemption never changes a token's distribution.

Routes (a mixture-of-experts model, `routes=(Lm, k)`): every token a row feeds the model gets the experts each
of the Lm sparse layers routed it to, returned as SampleResult.routed_experts (router replay trains on them).
A token keeps the routes it was first computed with: they are stored with its page (host, int16[num_pages,
page_size, Lm, k], about 1% of the page's keys and values for Qwen3-MoE shapes), so a prefix hit reads the
routes its cached keys / values were computed with, and a recompute (preemption, weight_update="recompute")
replays the row's recorded routes in its prefill, so its keys / values and routes are those of the first pass.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable

import numpy as np

from agentfly_jax.models.paged_attention import SINK_PAGE
from agentfly_jax.sampling.engine.pages import PagePool
from agentfly_jax.sampling.protocol import SampleResult, SamplingParams

WEIGHT_UPDATE_MODES = ("drain", "recompute")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static sizes of one engine (each a compiled shape: none changes with the request mix).

  num_slots: sequences running at once; num_pages / page_size: the cache; max_len: a sequence's context;
  prefill_tokens / prefill_chunks: a prefill call's token budget and its chunk lengths (one shape each:
  prefill_tokens // chunk rows x chunk tokens); decode_batches: decode batch sizes (the running rows are packed
  into the smallest that holds them: a row's slot is only its place in the queue, its keys / values are found
  through its block table); table_width: pages per block table (max_len's, rounded up to block_pages, the
  attention loop's block); decode_steps: decode steps per device call (stop
  checks every step on device); stop_width: stop ids a row may carry; weight_update: "drain" (rows in flight
  finish on the old weights) or "recompute"; batch_invariant: only keys / values a prefill computed are shared
  (PagedJaxSampler's batch_invariant: with one decode size and one prefill shape a request's tokens are then a
  function of its prompt, seed and weights, whatever ran beside it).
  """

  num_slots: int
  num_pages: int
  page_size: int
  max_len: int
  prefill_tokens: int
  prefill_chunks: tuple[int, ...]
  decode_batches: tuple[int, ...]
  table_width: int
  block_pages: int
  decode_steps: int
  stop_width: int
  weight_update: str = "drain"
  batch_invariant: bool = False


class Future:
  """A request's result, set once by the engine thread; `callback` (set before submit) runs then."""

  def __init__(self, callback: Callable[[], None] | None = None):
    self._event = threading.Event()
    self.callback = callback
    self.result: SampleResult | None = None
    self.error: BaseException | None = None

  def _set(self, result=None, error=None) -> None:
    self.result, self.error = result, error
    self._event.set()
    if self.callback is not None:
      self.callback()

  def done(self) -> bool:
    return self._event.is_set()

  def wait(self, timeout: float | None = None) -> SampleResult:
    if not self._event.wait(timeout):
      raise TimeoutError("the engine did not finish the request in time")
    if self.error is not None:
      raise self.error
    return self.result


@dataclasses.dataclass(eq=False)
class _Seq:
  prompt: list
  params: SamplingParams
  seed: int
  max_new: int
  future: Future
  arrival: float
  out: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  versions: list = dataclasses.field(default_factory=list)
  pages: list = dataclasses.field(default_factory=list)
  computed: int = 0  # positions whose keys / values are in the pages
  prefilled: int = 0  # the first of them a prefill computed (or a prefix hit brought; the rest: decode steps)
  slot: int | None = None
  prefilling: bool = False
  admitted: float | None = None
  cancelled: bool = False
  image: Any = None  # engine/images.ImageRequest of a request with images
  features: Any = None  # its images' merged features [M, D] (host), computed at admission
  features_version: int = -1  # the weights' version they were computed with
  routes: Any = None  # int16[prompt + max_new, Lm, k]: each position's experts (-1: not computed yet)

  @property
  def tokens(self) -> list:
    return self.prompt + self.out

  @property
  def keys(self) -> list:
    """What its pages are shared by (pages.py): the tokens, an image's pad tokens as the image's digest."""
    return (self.prompt if self.image is None else list(self.image.keys)) + self.out


class Engine:
  """Continuous batching over `config.num_slots` slots and a paged cache (see the module docstring).

  run_prefill(params, cache, arrays: dict) -> (token[R], logprob[R], cache) and run_decode(params, cache,
  arrays: dict) -> (tokens[S, K], logprobs[S, K], emitted[S], stopped[S], cache) run the jitted programs;
  `make_cache()` builds the zero pages (called in the engine thread, and again after a failure);
  run_vision(params, image_request) -> features [M, D] (a vision-language model; None: text only) runs the
  vision tower on a request's images, and the programs get M-RoPE positions (engine/images.py).
  `routes` (Lm, k) (a mixture-of-experts model; None: dense): the programs take `routed` int32[R, C, Lm, k] in
  the prefill arrays and return each fed token's experts as a last output (engine/programs.py).
  """

  def __init__(
    self, run_prefill, run_decode, make_cache, config: EngineConfig, params: Any, run_vision=None, routes=None
  ):
    if config.weight_update not in WEIGHT_UPDATE_MODES:
      raise ValueError(f"weight_update must be one of {WEIGHT_UPDATE_MODES}, got {config.weight_update!r}")
    self.config = config
    self._run_prefill, self._run_decode, self._make_cache = run_prefill, run_decode, make_cache
    self._run_vision = run_vision
    self.pool = PagePool(config.num_pages, config.page_size)
    self.route_shape = None if routes is None else tuple(int(x) for x in routes)
    self._page_routes = None  # int16[num_pages, page_size, Lm, k]: the routes of each page's tokens
    if self.route_shape is not None:
      self._page_routes = np.full((config.num_pages, config.page_size, *self.route_shape), -1, np.int16)
    self._params = params
    self.version = 0
    self._cache = None
    self._slots: list[_Seq | None] = [None] * config.num_slots
    self._waiting: collections.deque[_Seq] = collections.deque()
    self._inbox: list[_Seq] = []
    self._update: Any = None  # pending (params, mode)
    self._lock = threading.Condition()
    self._step_lock = threading.Lock()  # held by the engine thread for a whole step
    self._thread: threading.Thread | None = None
    self._closed = False
    self.reset_metrics()

  # ---------------------------------------------------------------- callers (any thread)
  def submit(
    self, prompt, params: SamplingParams, seed: int, future: Future | None = None, image=None, prompt_routes=None
  ) -> Future:
    """Queues a request (`image`: its engine/images.ImageRequest, or None); its future holds the result.
    `prompt_routes` (a mixture-of-experts engine): int[n <= len(prompt), Lm, k], the routes its first n prompt
    tokens were first computed with (a chain's earlier turns), replayed wherever they are computed again."""
    if image is not None and self._run_vision is None:
      raise ValueError("the request has images but this engine runs a text-only model")
    prompt = [int(t) for t in prompt]
    if prompt_routes is not None:
      shape = np.shape(prompt_routes)
      if self.route_shape is None or shape[1:] != self.route_shape or len(prompt_routes) > len(prompt):
        raise ValueError(
          f"prompt_routes of shape {shape} for a prompt of {len(prompt)}: this engine takes "
          + (f"[n <= {len(prompt)}, {self.route_shape[0]}, {self.route_shape[1]}]" if self.route_shape else "none")
        )
    max_new = min(params.max_new_tokens, self.config.max_len - len(prompt))
    need = self.pool.pages_for(len(prompt) + max_new)
    if need > self.pool.capacity:
      raise ValueError(
        f"request of {len(prompt)} prompt + {max_new} new tokens needs {need} pages of {self.config.page_size}; "
        f"the whole KV cache holds {self.pool.capacity} (raise rollout.kv_cache_gib, or the sampler's "
        "kv_cache_pages / kv_cache_gib)"
      )
    future = future or Future()
    seq = _Seq(prompt, params, int(seed) % 2**32, max_new, future, time.perf_counter(), image=image)
    if self.route_shape is not None:
      seq.routes = np.full((len(prompt) + max_new, *self.route_shape), -1, np.int16)
      if prompt_routes is not None:
        seq.routes[: len(prompt_routes)] = prompt_routes
    with self._lock:
      if self._closed:
        raise RuntimeError("the engine is closed")
      self._inbox.append(seq)
      self._ensure_thread()
      self._lock.notify_all()
    return future

  def cancel(self, future: Future) -> None:
    """Drops the request of `future` at the next step boundary (its pages are released)."""
    with self._lock:
      for seq in self._inbox:
        if seq.future is future:
          seq.cancelled = True
      for seq in list(self._waiting) + [s for s in self._slots if s is not None]:
        if seq.future is future:
          seq.cancelled = True
      self._lock.notify_all()

  def update_weights(self, params: Any) -> None:
    """New decode params, landing at the next step boundary allowed by `config.weight_update`; admission waits
    until then, so a request submitted after this call runs on the new weights."""
    with self._lock:
      self._update = params
      self._ensure_thread()
      self._lock.notify_all()

  def wait_idle(self, timeout: float = 60.0) -> None:
    """Blocks until no request is queued or running and no weight update is pending (tests)."""
    deadline = time.monotonic() + timeout
    with self._lock:
      while self._inbox or self._waiting or any(self._slots) or self._update is not None:
        if not self._lock.wait(max(0.0, deadline - time.monotonic())):
          raise TimeoutError("engine still busy")

  @contextlib.contextmanager
  def paused(self):
    """Holds the engine thread at a step boundary while the caller uses the cache (`take_cache`)."""
    with self._step_lock:
      yield

  def take_cache(self):
    """The device cache (built if need be), for a caller holding `paused()`; give it back with `put_cache`."""
    if self._cache is None:
      self._cache = self._make_cache()
    cache, self._cache = self._cache, None
    return cache

  def put_cache(self, cache) -> None:
    self._cache = cache

  def close(self) -> None:
    with self._lock:
      self._closed = True
      self._lock.notify_all()
    if self._thread is not None:
      self._thread.join(timeout=30)

  # ---------------------------------------------------------------- metrics
  def reset_metrics(self) -> None:
    self._m = collections.Counter()
    self._waits: list[float] = []
    self._occupancy: list[float] = []
    self._max_pages = 0

  def metrics(self, reset: bool = False) -> dict[str, float]:
    """Since the last reset: slot occupancy, KV pages used, preemptions, queue wait, prefill / decode tok/s,
    the share of decode row-steps that produced a token."""
    m = self._m
    out = {
      "sampler/slot_occupancy": float(np.mean(self._occupancy)) if self._occupancy else 0.0,
      "sampler/kv_pages_used_max": float(self._max_pages),
      "sampler/kv_pages_total": float(self.pool.capacity),
      "sampler/preemptions": float(m["preemptions"]),
      "sampler/queue_wait_s_mean": float(np.mean(self._waits)) if self._waits else 0.0,
      "sampler/queue_wait_s_max": float(np.max(self._waits)) if self._waits else 0.0,
      "sampler/prefill_tokens": float(m["prefill_tokens"]),
      "sampler/prefix_hit_tokens": float(m["prefix_hit_tokens"]),
      "sampler/decode_tokens": float(m["decode_tokens"]),
      "sampler/prefill_tok_s": m["prefill_tokens"] / m["prefill_s"] if m["prefill_s"] else 0.0,
      "sampler/decode_tok_s": m["decode_tokens"] / m["decode_s"] if m["decode_s"] else 0.0,
      "sampler/decode_row_step_use": m["decode_tokens"] / m["decode_row_steps"] if m["decode_row_steps"] else 0.0,
      "sampler/decode_batch_use": m["decode_tokens"] / m["decode_padded_row_steps"]
      if m["decode_padded_row_steps"]
      else 0.0,
      "sampler/prefill_chunk_use": m["prefill_tokens"] / m["prefill_row_tokens"] if m["prefill_row_tokens"] else 0.0,
      "sampler/requests": float(m["requests"]),
    }
    if reset:
      self.reset_metrics()
    return out

  # ---------------------------------------------------------------- engine thread
  def _ensure_thread(self) -> None:
    if self._thread is None or not self._thread.is_alive():
      self._thread = threading.Thread(target=self._loop, name="paged-engine", daemon=True)
      self._thread.start()

  def _loop(self) -> None:
    while True:
      with self._lock:
        while not (self._closed or self._inbox or self._waiting or any(self._slots) or self._update is not None):
          self._lock.wait()
        if self._closed:
          self._fail_all(RuntimeError("the engine was closed"))
          return
        self._waiting.extend(self._inbox)
        self._m["requests"] += len(self._inbox)
        self._inbox.clear()
      try:
        with self._step_lock:
          self._step()
      except BaseException as e:  # a failed program: every request in flight gets the error, the engine lives
        self._fail_all(e)
        self._cache = None  # rebuilt (zeros) at the next step: no cached page holds its keys any more
        self.pool.invalidate()
      with self._lock:
        self._lock.notify_all()

  def _fail_all(self, error: BaseException) -> None:
    for seq in list(self._waiting) + [s for s in self._slots if s is not None] + self._inbox:
      self._drop(seq)
      seq.future._set(error=error)
    self._waiting.clear()
    self._inbox.clear()

  def _step(self) -> None:
    if self._cache is None:
      self._cache = self._make_cache()
    self._drop_cancelled()
    self._land_update()
    if self._update is None:
      self._admit()
    self._prefill()
    self._decode()
    self._max_pages = max(self._max_pages, self.pool.in_use())

  def _running(self) -> list[_Seq]:
    return [s for s in self._slots if s is not None]

  def _drop(self, seq: _Seq) -> None:
    """Releases seq's slot and pages (nothing registered)."""
    if seq.slot is not None:
      self._slots[seq.slot] = None
      seq.slot = None
    self.pool.release(seq.pages)
    seq.pages, seq.computed, seq.prefilled = [], 0, 0

  def _drop_cancelled(self) -> None:
    for seq in [s for s in self._waiting if s.cancelled] + [s for s in self._running() if s.cancelled]:
      if seq in self._waiting:
        self._waiting.remove(seq)
      self._drop(seq)
      seq.future._set(error=RuntimeError("request cancelled"))

  def _land_update(self) -> None:
    if self._update is None:
      return
    if self.config.weight_update == "drain" and self._running():
      return  # rows in flight finish on the weights they started with
    for seq in sorted(self._running(), key=lambda s: s.admitted, reverse=True):
      self._preempt(seq, count=False)
    with self._lock:
      self._params, self._update = self._update, None
    self.pool.invalidate()
    self.version += 1

  def _admit(self) -> None:
    ps = self.config.page_size
    skipped = []
    while self._waiting and None in self._slots:
      seq = self._waiting.popleft()
      tokens = seq.keys
      # Recompute at least the last token (its logits are needed) and never write into a shared page.
      limit = (len(tokens) - 1) // ps
      hit = self.pool.peek(tokens, limit)
      if hit < limit and self._being_prefilled(tokens, (hit + 1) * ps):
        skipped.append(seq)  # another row writes this page now: take it from the cache once it is there
        continue
      hit_pages = self.pool.match(tokens, limit)
      new = self.pool.allocate(self.pool.pages_for(len(tokens)) - len(hit_pages))
      if new is None:
        self.pool.release(hit_pages)
        self._waiting.appendleft(seq)
        break
      seq.pages, seq.computed, seq.prefilling = hit_pages + new, len(hit_pages) * ps, True
      seq.prefilled = seq.computed
      if seq.routes is not None and hit_pages:  # the routes the cached keys / values were computed with
        seq.routes[: seq.computed] = self._page_routes[hit_pages].reshape(seq.computed, *self.route_shape)
      seq.slot = self._slots.index(None)
      self._slots[seq.slot] = seq
      if seq.admitted is None:
        seq.admitted = time.perf_counter()
        self._waits.append(seq.admitted - seq.arrival)
      if seq.image is not None and seq.features_version != self.version:
        seq.features, seq.features_version = np.asarray(self._run_vision(self._params, seq.image)), self.version
      self._m["prefix_hit_tokens"] += seq.computed
    self._waiting.extendleft(reversed(skipped))

  def _register(self, seq: _Seq) -> None:
    """Makes seq's full computed pages findable (pages.py) and stores their tokens' routes with them; with
    batch_invariant only those a prefill computed (a decode step's keys differ from a prefill's in rounding, and
    a page evicted and computed again must come back the same)."""
    computed = min(seq.computed, seq.prefilled) if self.config.batch_invariant else seq.computed
    self.pool.register(seq.keys, seq.pages, computed)
    if seq.routes is not None:
      full = min(computed, len(seq.keys)) // self.config.page_size
      self._page_routes[seq.pages[:full]] = seq.routes[: full * self.config.page_size].reshape(
        full, self.config.page_size, *self.route_shape
      )

  def _being_prefilled(self, tokens: list, n: int) -> bool:
    return any(
      s.prefilling and s.computed < n <= len(s.prompt) + len(s.out) and s.keys[:n] == tokens[:n]
      for s in self._running()
    )

  def _preempt(self, seq: _Seq, count: bool = True) -> None:
    """Back to the head of the queue, its pages released; resumes by recomputing prompt + what it wrote."""
    self._drop(seq)
    seq.prefilling = False
    self._waiting.appendleft(seq)
    if count:
      self._m["preemptions"] += 1

  def _table(self, seqs: list) -> np.ndarray:
    table = np.full((len(seqs), self.config.table_width), SINK_PAGE, np.int32)
    for i, seq in enumerate(seqs):
      if seq is not None:
        table[i, : len(seq.pages)] = seq.pages
    return table

  def _sampling_rows(self, seqs: list) -> dict:
    n = len(seqs)
    temperature, top_p = np.zeros((n,), np.float32), np.ones((n,), np.float32)
    top_k, seeds = np.zeros((n,), np.int32), np.zeros((n,), np.uint32)
    steps = np.zeros((n,), np.int32)
    for i, seq in enumerate(seqs):
      if seq is not None:
        p = seq.params
        temperature[i], top_k[i], top_p[i], seeds[i], steps[i] = p.temperature, p.top_k, p.top_p, seq.seed, len(seq.out)
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds, steps=steps)

  def _prefill_shape(self, rows: list[_Seq]) -> tuple[int, int]:
    """(rows, chunk) of the prefill shape that writes the most tokens of the oldest waiting rows."""
    best = None
    for chunk in self.config.prefill_chunks:
      r = max(1, self.config.prefill_tokens // chunk)
      useful = sum(min(chunk, len(s.tokens) - s.computed) for s in rows[:r])
      if best is None or useful > best[0]:
        best = (useful, r, chunk)
    return best[1], best[2]

  def _prefill(self) -> None:
    waiting = sorted((s for s in self._running() if s.prefilling), key=lambda s: s.admitted)
    if not waiting:
      return
    r, chunk = self._prefill_shape(waiting)
    rows = sorted(waiting[:r], key=lambda s: s.computed)  # like lengths together (paged_attend's row groups)
    tokens, positions = np.zeros((r, chunk), np.int32), np.zeros((r, chunk), np.int32)
    valid, last = np.zeros((r, chunk), bool), np.zeros((r,), np.int32)
    taken = []
    for i, seq in enumerate(rows):
      seq_tokens = seq.tokens
      n = min(chunk, len(seq_tokens) - seq.computed)
      tokens[i, :n] = seq_tokens[seq.computed : seq.computed + n]
      positions[i, :n] = np.arange(seq.computed, seq.computed + n)
      valid[i, :n], last[i] = True, n - 1
      taken.append(n)
    padded = rows + [None] * (r - len(rows))
    arrays = dict(
      tokens=tokens,
      positions=positions,
      valid=valid,
      block_tables=self._table(padded),
      last_index=last,
      **self._sampling_rows(padded),
    )
    if any(seq.image is not None for seq in rows):
      arrays.update(self._image_rows(rows, positions, taken))
    if self.route_shape is not None:  # recorded routes replayed (a recompute), -1 elsewhere
      arrays["routed"] = np.full((r, chunk, *self.route_shape), -1, np.int32)
      for i, (seq, n) in enumerate(zip(rows, taken)):
        arrays["routed"][i, :n] = seq.routes[seq.computed : seq.computed + n]
    start = time.perf_counter()
    token, logprob, self._cache, *routes = self._run_prefill(self._params, self._cache, arrays)
    token, logprob = np.asarray(token), np.asarray(logprob)
    routes = np.asarray(routes[0]) if routes else None
    self._m["prefill_s"] += time.perf_counter() - start
    self._m["prefill_tokens"] += sum(taken)
    self._m["prefill_row_tokens"] += r * chunk
    for i, (seq, n) in enumerate(zip(rows, taken)):
      if routes is not None:
        seq.routes[seq.computed : seq.computed + n] = routes[i, :n]
      seq.computed += n
      seq.prefilled = seq.computed
      if seq.computed < len(seq.tokens):
        continue
      seq.prefilling = False
      self._register(seq)
      self._emit(seq, [int(token[i])], [float(logprob[i])], stopped=int(token[i]) in seq.params.stop_token_ids)

  def _image_rows(self, rows: list[_Seq], positions: np.ndarray, taken: list) -> dict:
    """A chunk's M-RoPE positions int32[3, R, C] and image features [R, C, D] + mask bool[R, C] (text rows:
    their positions on all three axes, no features)."""
    rope = np.broadcast_to(positions, (3,) + positions.shape).copy()
    dim = next(s.features.shape[1] for s in rows if s.image is not None)
    dtype = next(s.features.dtype for s in rows if s.image is not None)
    embeds, mask = np.zeros(positions.shape + (dim,), dtype), np.zeros(positions.shape, bool)
    for i, (seq, n) in enumerate(zip(rows, taken)):
      if seq.image is not None:
        rope[:, i, :n] = seq.image.rope_positions(seq.computed, n)
        embeds[i, :n], mask[i, :n] = seq.image.chunk_embeds(seq.features, seq.computed, n)
    return dict(rope_positions=rope, image_embeds=embeds, image_mask=mask)

  def _emit(self, seq: _Seq, tokens: list, logprobs: list, stopped: bool) -> None:
    seq.out.extend(tokens)
    seq.logprobs.extend(logprobs)
    seq.versions.extend([self.version] * len(tokens))
    if stopped or len(seq.out) >= seq.max_new:
      self._register(seq)
      # the routes of every token fed to the model: the prompt and each new token but the last
      routes = None if seq.routes is None else seq.routes[: seq.computed].copy()
      self._drop(seq)
      seq.future._set(
        SampleResult(
          token_ids=list(seq.out),
          logprobs=list(seq.logprobs),
          finish_reason="stop" if stopped else "length",
          token_versions=list(seq.versions),
          routed_experts=routes,
        )
      )

  def _reserve_decode_pages(self, rows: list[_Seq]) -> list[_Seq]:
    """Pages for every decoding row's next block, preempting the latest admitted rows when the pool is short."""
    k = self.config.decode_steps
    rows = sorted(rows, key=lambda s: s.admitted)
    while rows:
      short = []
      for seq in rows:
        need = self.pool.pages_for(seq.computed + min(k, seq.max_new - len(seq.out))) - len(seq.pages)
        if need > 0:
          short.append((seq, need))
      if sum(n for _, n in short) <= self.pool.available():
        for seq, need in short:
          seq.pages.extend(self.pool.allocate(need))
        return rows
      self._preempt(rows.pop())  # the most recently admitted
    return rows

  def _decode(self) -> None:
    cfg = self.config
    rows = self._reserve_decode_pages([s for s in self._running() if not s.prefilling])
    if not rows:
      return
    rows.sort(key=lambda s: s.computed)  # rows of like length share an attention loop (paged_attend's groups)
    b = next((x for x in cfg.decode_batches if x >= len(rows)), cfg.decode_batches[-1])
    tokens, positions = np.zeros((b,), np.int32), np.zeros((b,), np.int32)
    live, remaining = np.zeros((b,), bool), np.zeros((b,), np.int32)
    stop_ids = np.full((b, cfg.stop_width), -1, np.int32)
    for i, seq in enumerate(rows):
      tokens[i], positions[i], live[i] = seq.out[-1], seq.computed, True
      remaining[i] = seq.max_new - len(seq.out)
      stop = seq.params.stop_token_ids[: cfg.stop_width]
      stop_ids[i, : len(stop)] = stop
    padded = rows + [None] * (b - len(rows))
    arrays = dict(
      tokens=tokens,
      positions=positions,
      block_tables=self._table(padded),
      live=live,
      remaining=remaining,
      stop_ids=stop_ids,
      **self._sampling_rows(padded),
    )
    if self._run_vision is not None:  # text positions: index + the row's delta (0 for a text request)
      arrays["rope_delta"] = np.array([0 if s is None or s.image is None else s.image.delta for s in padded], np.int32)
    start = time.perf_counter()
    out_t, out_lp, emitted, stopped, self._cache, *routes = self._run_decode(self._params, self._cache, arrays)
    out_t, out_lp, emitted, stopped = (np.asarray(x) for x in (out_t, out_lp, emitted, stopped))
    routes = np.asarray(routes[0]) if routes else None
    self._m["decode_s"] += time.perf_counter() - start
    self._m["decode_tokens"] += int(emitted.sum())
    self._m["decode_row_steps"] += len(rows) * int(emitted.max())
    self._m["decode_padded_row_steps"] += b * int(emitted.max())
    self._occupancy.append(len(rows) / cfg.num_slots)
    for i, seq in enumerate(rows):
      n = int(emitted[i])
      if routes is not None:
        seq.routes[seq.computed : seq.computed + n] = routes[i, :n]
      seq.computed += n
      self._emit(seq, out_t[i, :n].tolist(), out_lp[i, :n].tolist(), stopped=bool(stopped[i]))
