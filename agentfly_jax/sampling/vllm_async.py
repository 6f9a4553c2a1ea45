"""vLLM's asyncio engine (`vllm.v1.engine.async_llm.AsyncLLM`) on a loop thread of its own.

The rollout is trio and the trainer is synchronous; AsyncLLM is asyncio. An `AsyncEngine` runs
one asyncio event loop in a daemon thread and builds the AsyncLLM inside it, so its output
handler and ZMQ sockets live on that loop. Callers reach it in three ways:

* trio: `await engine.agenerate(...)` schedules the request's coroutine on the loop
  (`asyncio.run_coroutine_threadsafe`) and waits on a `trio.Event` that the loop thread sets
  through the trio token (`run_sync_soon`): no worker thread is held per request, so thousands
  of chains can wait at once. Cancelling the trio caller cancels the asyncio task, and vLLM
  aborts the request.
* synchronous: `engine.generate_many(...)` submits every request at once and blocks until all
  are done (not from the loop thread itself).
* exclusive work (a weight load, a new LoRA adapter): `engine.exclusive(fn)` closes admission,
  waits until no request is in flight, runs `await fn(async_llm)` and reopens admission.
  Requests submitted meanwhile wait at the gate and run after it, on what `fn` loaded.

Each request enters vLLM on its own, so vLLM's scheduler admits it at the next engine step
(continuous batching) instead of after a batch ends. AsyncLLM always runs its engine core in a
child process (`make_async_mp_client`), so weights reach it as bytes over its RPC.

`drive_requests` runs a list of requests against a bare AsyncLLM, each on its own task, for
benchmarks that need vLLM itself as the reference engine.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import itertools
import threading
import time
import weakref
from typing import Any, Awaitable, Callable, Sequence

import trio


class AsyncEngine:
  """One AsyncLLM on a dedicated asyncio loop thread (see the module docstring).

  Args:
    engine_args: keyword arguments of `vllm.AsyncEngineArgs` (model, dtype, max_model_len, ...).
    start_timeout_s: how long building the engine (loading the model in the child) may take.

  Attributes:
    max_in_flight: most requests in flight at once so far (a measure of overlap for tests and
      metrics).
  """

  def __init__(self, engine_args: dict, *, start_timeout_s: float = 900.0):
    self._loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-asyncio", daemon=True)
    self._thread.start()
    self._ids = itertools.count()
    self._in_flight = 0
    self.max_in_flight = 0
    self._llm = None
    try:
      self._llm = self._call(self._start(engine_args), timeout=start_timeout_s)
    except BaseException:
      self._stop_loop()
      raise
    _LIVE.add(self)

  async def _start(self, engine_args: dict):
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    # asyncio primitives made on the loop they are used on
    self._open = asyncio.Event()  # set: new requests may enter the engine
    self._open.set()
    self._idle = asyncio.Event()  # set: no request in flight
    self._idle.set()
    self._exclusive_lock = asyncio.Lock()
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))

  @property
  def closed(self) -> bool:
    return self._llm is None

  @property
  def in_flight(self) -> int:
    """Requests inside vLLM now (past the admission gate, not finished)."""
    return self._in_flight

  def _call(self, coro: Awaitable, timeout: float | None = None) -> Any:
    if threading.current_thread() is self._thread:
      coro.close()
      raise RuntimeError("AsyncEngine: a blocking call was made from its own asyncio loop thread")
    return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

  def _check_open(self) -> None:
    if self._llm is None:
      raise RuntimeError("AsyncEngine: the engine was closed")

  # ------------------------------------------------------------------ requests
  async def _generate(self, prompt_ids: list[int], params: Any, lora: Callable[[], Any] | None) -> Any:
    """Runs on the loop: waits at the admission gate, then streams the request through vLLM
    and returns its final RequestOutput."""
    from vllm.inputs import TokensPrompt

    while not self._open.is_set():  # re-checked: the gate may close again before we run
      await self._open.wait()
    self._in_flight += 1
    self.max_in_flight = max(self.max_in_flight, self._in_flight)
    self._idle.clear()
    try:
      final = None
      stream = self._llm.generate(
        TokensPrompt(prompt_token_ids=prompt_ids),
        params,
        request_id=f"agentfly-{next(self._ids)}",
        lora_request=None if lora is None else lora(),
      )
      async for out in stream:
        final = out
      if final is None or not final.finished:
        raise RuntimeError("AsyncEngine: vLLM ended the request without a finished output")
      return final
    finally:
      self._in_flight -= 1
      if self._in_flight == 0:
        self._idle.set()

  def submit(self, prompt_ids: Sequence[int], params: Any, lora: Callable[[], Any] | None = None):
    """Schedules one request; returns a `concurrent.futures.Future` of its final RequestOutput.
    `lora()` is called on the loop once the request passes the admission gate."""
    self._check_open()
    coro = self._generate([int(t) for t in prompt_ids], params, lora)
    return asyncio.run_coroutine_threadsafe(coro, self._loop)

  async def agenerate(self, prompt_ids: Sequence[int], params: Any, lora: Callable[[], Any] | None = None) -> Any:
    """From trio: one request's final RequestOutput (see the module docstring)."""
    return await wait_in_trio(self.submit(prompt_ids, params, lora))

  def generate_many(self, requests: Sequence[tuple[Sequence[int], Any]], lora: Callable[[], Any] | None = None) -> list:
    """Blocking: every (prompt ids, vllm.SamplingParams) submitted at once; outputs in order."""
    self._check_open()
    futures = [self.submit(p, s, lora) for p, s in requests]
    try:
      return [f.result() for f in futures]
    except BaseException:
      for f in futures:  # one failed (or we were interrupted): abort the rest in vLLM
        f.cancel()
      raise

  # ------------------------------------------------------------------ exclusive work
  def exclusive(self, fn: Callable[[Any], Awaitable[Any]]) -> Any:
    """Blocking: closes admission, waits for every in-flight request to finish, returns
    `await fn(async_llm)` and reopens admission (also when `fn` raises)."""
    self._check_open()
    return self._call(self._exclusive(fn))

  async def _exclusive(self, fn):
    async with self._exclusive_lock:
      self._open.clear()
      try:
        await self._idle.wait()
        return await fn(self._llm)
      finally:
        self._open.set()

  def run(self, fn: Callable[[Any], Awaitable[Any]], timeout: float | None = None) -> Any:
    """Blocking: `await fn(async_llm)` on the loop, beside the sampler's requests (no gate);
    e.g. `engine.run(lambda llm: drive_requests(llm, requests))`."""
    self._check_open()
    return self._call(fn(self._llm), timeout=timeout)

  def collective_rpc(self, method: Any, args: tuple = (), kwargs: dict | None = None) -> list:
    """Blocking: `AsyncLLM.collective_rpc` with admission paused (one result per worker)."""

    async def rpc(llm):
      return await llm.collective_rpc(method, args=args, kwargs=kwargs)

    return self.exclusive(rpc)

  # ------------------------------------------------------------------ shutdown
  def close(self) -> None:
    """Aborts what is in flight, shuts the engine core process down and stops the loop thread.
    Idempotent."""
    llm, self._llm = self._llm, None
    _LIVE.discard(self)
    if llm is not None and self._loop.is_running():

      async def shutdown():
        for task in asyncio.all_tasks():
          if task is not asyncio.current_task():
            task.cancel()
        await asyncio.sleep(0)
        llm.shutdown()

      try:
        self._call(shutdown(), timeout=60)
      except Exception:  # the loop is wedged: shut the child down from here
        llm.shutdown()
    elif llm is not None:
      llm.shutdown()
    self._stop_loop()

  def _stop_loop(self) -> None:
    if self._loop.is_running():
      self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(timeout=30)
    if not self._thread.is_alive() and not self._loop.is_closed():
      self._loop.close()

  def __enter__(self) -> "AsyncEngine":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


_LIVE: "weakref.WeakSet[AsyncEngine]" = weakref.WeakSet()


@atexit.register
def _close_live_engines() -> None:
  """No engine core process outlives the interpreter, even if nobody called close()."""
  for engine in list(_LIVE):
    try:
      engine.close()
    except Exception:
      pass


async def wait_in_trio(future: concurrent.futures.Future) -> Any:
  """Awaits a `concurrent.futures.Future` completed by another thread, from trio, without a
  worker thread: the completing thread wakes this task through the trio token. Cancelling this
  task cancels the future."""
  token = trio.lowlevel.current_trio_token()
  done = trio.Event()

  def wake(_future) -> None:
    try:
      token.run_sync_soon(done.set)
    except trio.RunFinishedError:  # the trio run that waited is gone
      pass

  future.add_done_callback(wake)
  try:
    await done.wait()
  except BaseException:
    future.cancel()
    raise
  if future.cancelled():  # not by this task: the engine was closed under it
    raise RuntimeError("AsyncEngine: the request was cancelled on the engine's side (engine closed)")
  return future.result()


async def generate_one(llm: Any, prompt_ids: Sequence[int], params: Any, request_id: str, **kwargs) -> Any:
  """One request on a bare `AsyncLLM` (from its loop): its final RequestOutput."""
  from vllm.inputs import TokensPrompt

  final = None
  prompt = TokensPrompt(prompt_token_ids=[int(t) for t in prompt_ids])
  async for out in llm.generate(prompt, params, request_id=request_id, **kwargs):
    final = out
  return final


async def drive_requests(
  llm: Any, requests: Sequence[tuple[Sequence[int], Any]], *, start_times: Sequence[float] | None = None
) -> list[dict]:
  """Runs requests against a bare `AsyncLLM`, each on its own asyncio task (the reference way
  of feeding vLLM: every request admitted at the engine's next step).

  Args:
    llm: a running `vllm.v1.engine.async_llm.AsyncLLM` (call from its own loop, e.g. through
      `AsyncEngine.run`).
    requests: (prompt token ids, vllm.SamplingParams) each.
    start_times: optional seconds after the call at which each request is submitted (a
      workload's arrival times); default all at once.
  Returns:
    One dict per request, in order: {"output": final RequestOutput, "submitted_s",
    "finished_s"} (seconds since the call).
  """
  if start_times is not None and len(start_times) != len(requests):
    raise ValueError(f"drive_requests: {len(start_times)} start_times for {len(requests)} requests")
  t0 = time.perf_counter()
  prefix = f"drive-{next(_DRIVE_IDS)}-"

  async def one(i: int, prompt_ids, params) -> dict:
    if start_times is not None:
      await asyncio.sleep(max(0.0, float(start_times[i]) - (time.perf_counter() - t0)))
    submitted = time.perf_counter() - t0
    output = await generate_one(llm, prompt_ids, params, f"{prefix}{i}")
    return {"output": output, "submitted_s": submitted, "finished_s": time.perf_counter() - t0}

  return list(await asyncio.gather(*(one(i, p, s) for i, (p, s) in enumerate(requests))))


_DRIVE_IDS = itertools.count()
