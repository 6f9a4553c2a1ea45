"""Trio code awaited from asyncio code: the bridge that lets an asyncio agent await a `Tool`.

  host = TrioHost(nursery)              # in the trio run that hosts the asyncio agents' chains
  CURRENT_HOST.set(host)                # inside each asyncio chain (its context, copied to its tasks)
  text = await call_from_asyncio(my_tool.acall, key="fox")   # in asyncio: runs in the trio run

An asyncio agent (agents/agent_loops.py) runs in an asyncio loop in a worker thread while the rollout,
the endpoint, the sampler and the tools' limits and env servers stay in trio. `Tool.acall` awaited
there comes here: the call is started in the hosting trio run (`TrioToken.run_sync_soon` +
`nursery.start_soon`) and its result comes back through a `concurrent.futures.Future` the asyncio
side awaits; no thread per call. Outside any hosting trio run (a user's own `asyncio.run`), the
call runs in a fresh trio loop in a worker thread.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
from typing import Any, Awaitable, Callable

import trio


class TrioHost:
  """A trio run that asyncio code may start trio calls in: its token + a nursery of it."""

  def __init__(self, nursery: trio.Nursery):
    self.nursery, self.token = nursery, trio.lowlevel.current_trio_token()


CURRENT_HOST: contextvars.ContextVar[TrioHost | None] = contextvars.ContextVar("agentfly_trio_host", default=None)


async def call_from_asyncio(async_fn: Callable[..., Awaitable[Any]], *args, **kwargs) -> Any:
  """`await async_fn(*args, **kwargs)` run in trio, awaited from asyncio; its result or exception."""
  import asyncio

  host = CURRENT_HOST.get()
  call = functools.partial(async_fn, *args, **kwargs)
  if host is None:
    return await asyncio.to_thread(trio.run, call)
  future: concurrent.futures.Future = concurrent.futures.Future()
  cancel_scope = trio.CancelScope()

  async def runner():
    try:
      with cancel_scope:
        future.set_result(await call())
    except Exception as e:
      future.set_exception(e)
    finally:
      if not future.done():  # cancelled (from the asyncio side, or the hosting run ends)
        future.cancel()

  host.token.run_sync_soon(host.nursery.start_soon, runner)
  try:
    return await asyncio.wrap_future(future)
  except asyncio.CancelledError:
    host.token.run_sync_soon(cancel_scope.cancel)
    raise
