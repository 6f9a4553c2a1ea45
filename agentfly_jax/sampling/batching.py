"""Gathers concurrent trio requests into batches for a synchronous batch generator.

Many rollout chains call `await sampler.agenerate(prompt, params)` at once; each call is one
request. A `BatchingScheduler` queues them and runs them in batches through a synchronous
`run_batch(prompts, params_list) -> results` (the JAX or vLLM sampler's batch entry point) in a
worker thread (`trio.to_thread.run_sync`), so the trio loop keeps serving tool calls while the
model runs. No background task is needed: the first waiting caller becomes the *collector*,

  1. waits until no batch is running (requests arriving meanwhile pile up in the queue),
  2. then waits up to `max_wait_s` more, or until `max_batch_size` requests are queued,
  3. takes up to `max_batch_size` requests (first come first served) and gives up the collector
     role (so the next batch can gather while this one runs),
  4. runs the batch in a thread and hands each caller its own result (or exception).

One scheduler serves one sampler; batches run one at a time. It may be used from several
successive `trio.run`s (its trio primitives are rebuilt for each run).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import trio


@dataclasses.dataclass(eq=False)
class _Request:
  prompt: Sequence[int]
  params: Any
  finished: bool = False
  result: Any = None
  error: BaseException | None = None


RunBatch = Callable[[list, list], list]


class BatchingScheduler:
  """Batches concurrent async requests into calls of `run_batch`.

  Args:
    run_batch: synchronous `(prompts: list[list[int]], params_list: list) -> list[result]`,
      one result per prompt, in order. Called from a worker thread.
    max_batch_size: most requests per `run_batch` call.
    max_wait_s: how long the collector waits for more requests after the engine is free.
    validate: optional `(prompt, params) -> None` run in the caller before queueing; raising
      there fails only that caller (a bad request never poisons a batch).
  """

  def __init__(
    self,
    run_batch: RunBatch,
    *,
    max_batch_size: int,
    max_wait_s: float = 0.005,
    validate: Callable[[Sequence[int], Any], None] | None = None,
  ):
    if max_batch_size < 1:
      raise ValueError(f"BatchingScheduler: max_batch_size must be >= 1, got {max_batch_size}")
    if max_wait_s < 0:
      raise ValueError(f"BatchingScheduler: max_wait_s must be >= 0, got {max_wait_s}")
    self._run_batch = run_batch
    self.max_batch_size = int(max_batch_size)
    self.max_wait_s = float(max_wait_s)
    self._validate = validate
    self.batch_sizes: list[int] = []  # size of every batch run, in order (for tests/metrics)
    self.batch_seconds: list[float] = []
    self._token = None
    self._reset_trio_state()

  def _reset_trio_state(self) -> None:
    self._pending: list[_Request] = []
    self._collecting = False
    self._engine_busy = False
    self._wake = trio.Event()  # set (and replaced) whenever waiters should re-check state
    self._full = trio.Event()  # set when the queue reaches max_batch_size

  def _ensure_run_state(self) -> None:
    token = trio.lowlevel.current_trio_token()
    if token is not self._token:  # first use in this trio.run
      self._token = token
      self._reset_trio_state()

  def _notify(self) -> None:
    self._wake.set()
    self._wake = trio.Event()

  async def submit(self, prompt: Sequence[int], params: Any) -> Any:
    """Queues one request and returns its result once its batch has run."""
    self._ensure_run_state()
    if self._validate is not None:
      self._validate(prompt, params)
    request = _Request(prompt=prompt, params=params)
    self._pending.append(request)
    if len(self._pending) >= self.max_batch_size:
      self._full.set()
    try:
      while not request.finished:
        if not self._collecting and request in self._pending:
          await self._collect_and_run()
        else:
          await self._wake.wait()
    except BaseException:
      if request in self._pending:  # cancelled before its batch started
        self._pending.remove(request)
      raise
    if request.error is not None:
      raise request.error
    return request.result

  async def _collect_and_run(self) -> None:
    self._collecting = True
    try:
      while self._engine_busy:  # let requests pile up while a batch runs
        await self._wake.wait()
      if len(self._pending) < self.max_batch_size:
        with trio.move_on_after(self.max_wait_s):
          await self._full.wait()
      batch = self._pending[: self.max_batch_size]
      del self._pending[: len(batch)]
      self._full = trio.Event()
      if len(self._pending) >= self.max_batch_size:
        self._full.set()
      self._engine_busy = True
    finally:
      self._collecting = False
      self._notify()  # a leftover request may now become the collector
    try:
      await self._run(batch)
    finally:
      self._engine_busy = False
      self._notify()

  async def _run(self, batch: list[_Request]) -> None:
    if not batch:
      return
    prompts = [list(r.prompt) for r in batch]
    params_list = [r.params for r in batch]
    start = time.perf_counter()
    try:
      results = await trio.to_thread.run_sync(self._run_batch, prompts, params_list)
      if len(results) != len(batch):
        raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} requests")
    except Exception as e:  # every caller of the failed batch sees the error
      for r in batch:
        r.error, r.finished = e, True
    else:
      for r, res in zip(batch, results):
        r.result, r.finished = res, True
    self.batch_sizes.append(len(batch))
    self.batch_seconds.append(time.perf_counter() - start)
