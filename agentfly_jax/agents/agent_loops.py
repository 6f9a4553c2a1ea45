"""Where a black-box agent's code runs: trio, asyncio or a thread, chosen per agent function.

  style = agent_style(run)            # "trio" | "asyncio" | "sync"
  answer, timed_out = await call_agent(style, run, row, base_url=..., api_key=..., timeout_s=...)

The rollout, the endpoint and the sampler run in trio (agents/endpoint_rollout.py). An agent is:
- `async def run(client, row)` written against asyncio (`asyncio.gather` / `wait_for` / `sleep` /
  `Semaphore`, asyncio HTTP clients, the OpenAI Agents SDK, LangGraph, ...): the default. It runs in
  ONE asyncio loop in a worker thread (`AsyncioAgentLoop`, started once per process, shared by all
  chains); each chain is a task there with its own `openai.AsyncOpenAI`; its end wakes the trio
  side through the trio token (no thread per chain, no polling). `Tool.acall` awaited by it runs
  back in the trio run (tools/trio_host.py), so tools keep their limits and env servers.
- `async def run(client, row)` that uses trio (its code names `trio`): run in the rollout's trio
  loop as before. `run.agent_loop = "trio" | "asyncio"` overrides the guess.
- `def run(client, row)` (the synchronous `openai.OpenAI` client): in a worker thread per chain
  (`trio.to_thread`, under the rollout's thread limiter).

Why a loop in a thread and not trio-asyncio: it leaves the trio endpoint and sampler exactly as they
were (the asyncio agents' HTTP requests reach the endpoint over loopback as any client's do); trio-asyncio
was slower and, once its loop had run, broke the loop thread's chains in the same process (it replaces
asyncio's event loop policy process-wide). The two threads share the GIL: the loop thread buys
compatibility, not parallelism.

Why the asyncio chains' HTTP goes through aiohttp (httpx-aiohttp's transport; `USE_AIOHTTP`, env
AGENTFLY_ASYNCIO_AIOHTTP=0 for httpx's own): the gap to the trio agent was the client's HTTP stack, not the
thread hand-over. httpcore reaches sockets through anyio on asyncio (h11 in pure Python; on trio it uses its
native backend); aiohttp uses asyncio's streams and its C parser. The GIL switch interval is left at the
interpreter's 5 ms (lowering it while the loop thread hosts a chain gave no consistent gain).

The measurements behind each choice (asyncio agent vs trio agent, per transport and switch interval):
lab/results/agent_loops.md; the current table: lab/results/bench_endpoint.md (lab/bench/bench_endpoint.py).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
import types
from typing import Any, Callable

import trio

from agentfly_jax.tools.trio_host import CURRENT_HOST, TrioHost

STYLES = ("trio", "asyncio", "sync")

# The asyncio chains' HTTP client sends through aiohttp (module docstring); env AGENTFLY_ASYNCIO_AIOHTTP=0: httpx's own.
USE_AIOHTTP = os.environ.get("AGENTFLY_ASYNCIO_AIOHTTP", "1") != "0"


def _unwrap(fn):
  while True:
    inner = getattr(fn, "func", None) or getattr(fn, "__wrapped__", None)
    if inner is None or inner is fn:
      return fn
    fn = inner


def _names_trio(fn) -> bool:
  """Does `fn`'s code (and the code of functions defined inside it) name trio?"""
  fn = _unwrap(fn)
  code, scope = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
  todo = [code] if code is not None else []
  while todo:
    c = todo.pop()
    for name in c.co_names:
      obj = scope.get(name)
      module = getattr(obj, "__module__", None) if obj is not None else None
      if obj is trio or (isinstance(module, str) and (module == "trio" or module.startswith("trio."))):
        return True
    todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
  return False


def agent_style(agent_fn: Callable) -> str:
  """ "trio", "asyncio" or "sync" for an agent function (see the module docstring); `agent_fn.agent_loop`
  ("trio" / "asyncio") overrides the guess for an async function. ValueError for a bad override."""
  forced = getattr(agent_fn, "agent_loop", None)
  is_async = any(
    inspect.iscoroutinefunction(f) for f in (agent_fn, _unwrap(agent_fn), getattr(agent_fn, "__call__", None))
  )
  if forced is not None:
    if forced not in ("trio", "asyncio") or not is_async:
      raise ValueError(
        f"agent {getattr(agent_fn, '__name__', agent_fn)!r}: agent_loop must be 'trio' or 'asyncio' on an async "
        f"function, got {forced!r}" + ("" if is_async else " on a synchronous one")
      )
    return forced
  if not is_async:
    return "sync"
  return "trio" if _names_trio(agent_fn) else "asyncio"


class AsyncioAgentLoop:
  """One asyncio event loop in a daemon thread, running asyncio agents' chains (`run`)."""

  _instance: "AsyncioAgentLoop | None" = None
  _lock = threading.Lock()

  def __init__(self):
    self.loop = asyncio.new_event_loop()
    self.thread = threading.Thread(target=self.loop.run_forever, name="agentfly-asyncio-agents", daemon=True)
    self.thread.start()

  @classmethod
  def shared(cls) -> "AsyncioAgentLoop":
    with cls._lock:
      if cls._instance is None or not cls._instance.thread.is_alive():
        cls._instance = cls()
      return cls._instance

  async def run(self, coro_fn: Callable, *args) -> Any:
    """Awaited in trio: `await coro_fn(*args)` as a task of the asyncio loop; its result or exception.
    Cancelled in trio: the task is cancelled and waited for (5 s at most)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future = asyncio.run_coroutine_threadsafe(coro_fn(*args), self.loop)

    def wake(_):
      try:
        token.run_sync_soon(done.set)
      except trio.RunFinishedError:
        pass

    future.add_done_callback(wake)
    try:
      await done.wait()
    except BaseException:
      future.cancel()
      with trio.CancelScope(shield=True), trio.move_on_after(5):
        await done.wait()
      raise
    return future.result()


def _http_client(ssl_context, sync: bool = False, over_aiohttp: bool = False):
  """A chain's own HTTP client: one keep-alive connection to the endpoint (a pool shared by all
  chains costs O(connections) per request in httpcore), no proxies from the environment (the
  endpoint is on loopback), no timeout (a turn takes as long as the sampler needs). `over_aiohttp`
  (asyncio chains, unless `USE_AIOHTTP` is off): the bytes go through aiohttp, with httpx-aiohttp's
  transport (the one the openai SDK's `DefaultAioHttpClient` uses; measured faster in the loop thread)."""
  import httpx

  limits = httpx.Limits(max_connections=4, max_keepalive_connections=1)
  kwargs = {"limits": limits}
  if over_aiohttp and USE_AIOHTTP:
    kwargs = {"transport": _aiohttp_transport()(verify=ssl_context or True, trust_env=False, limits=limits)}
  cls = httpx.Client if sync else httpx.AsyncClient
  return cls(verify=ssl_context, trust_env=False, timeout=httpx.Timeout(None), **kwargs)


@functools.cache
def _aiohttp_transport():
  """httpx-aiohttp's `AiohttpTransport`, with a refused connection reported as `httpx.ConnectError`
  (the SDK's APIConnectionError) instead of its `ConnectTimeout` (its exception map lets aiohttp's
  ClientConnectionError entry win over ClientConnectorError's: an agent would read "timed out")."""
  import aiohttp
  import httpx
  import httpx_aiohttp

  class AiohttpTransport(httpx_aiohttp.AiohttpTransport):
    async def handle_async_request(self, request):
      try:
        return await super().handle_async_request(request)
      except httpx.ConnectTimeout as e:
        if isinstance(e.__cause__, aiohttp.ClientConnectorError) and not isinstance(e.__cause__, TimeoutError):
          raise httpx.ConnectError(str(e), request=request) from e.__cause__
        raise

  return AiohttpTransport


async def _asyncio_chain(agent_fn, row, base_url, api_key, ssl_context, timeout_s, host):
  """In the asyncio loop: the chain's client, the agent under its timeout; (answer, timed_out)."""
  import openai

  CURRENT_HOST.set(host)  # this task's context (and its child tasks'): Tool.acall finds the trio run
  http = _http_client(ssl_context, over_aiohttp=True)
  client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http, max_retries=0)
  try:
    if not timeout_s:
      return await agent_fn(client, row), False
    try:
      async with asyncio.timeout(timeout_s) as limit:
        return await agent_fn(client, row), False
    except TimeoutError:
      if limit.expired():
        return None, True
      raise
  finally:
    await http.aclose()


async def call_agent(
  style: str,
  agent_fn: Callable,
  row: dict,
  *,
  base_url: str,
  api_key: str,
  ssl_context,
  timeout_s: float | None,
  thread_limiter: trio.CapacityLimiter,
  host: TrioHost,
) -> tuple[Any, bool]:
  """Runs one chain's `agent_fn(client, row)` in its style's loop, awaited in trio; returns (answer,
  timed_out). The agent's exception propagates (it is the chain's, `endpoint_rollout` records it)."""
  import openai

  if style == "asyncio":
    return await AsyncioAgentLoop.shared().run(
      _asyncio_chain, agent_fn, row, base_url, api_key, ssl_context, timeout_s, host
    )
  if style == "sync":
    http = _http_client(ssl_context, sync=True)
    client = openai.OpenAI(base_url=base_url, api_key=api_key, http_client=http, max_retries=0)
    answer = None
    try:
      with trio.move_on_after(timeout_s) if timeout_s else trio.CancelScope() as scope:
        answer = await trio.to_thread.run_sync(agent_fn, client, row, limiter=thread_limiter, abandon_on_cancel=True)
    finally:
      if not scope.cancelled_caught:
        http.close()  # a timed-out thread still runs: its requests get 401 once the chain is closed
    return answer, scope.cancelled_caught
  http = _http_client(ssl_context)
  client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http, max_retries=0)
  answer = None
  try:
    with trio.move_on_after(timeout_s) if timeout_s else trio.CancelScope() as scope:
      answer = await agent_fn(client, row)
    return answer, scope.cancelled_caught
  finally:
    with trio.CancelScope(shield=True):
      await http.aclose()
