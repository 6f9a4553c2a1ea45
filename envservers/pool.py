"""A pool of warm env instances of one type, bound to chains.

- Warm: `warm` idle instances are kept started ahead of demand (up to the cap).
- Cap: never more than `cap` live instances (starting, idle, bound, or closing).
- Binding: acquire(key) for the same key returns the same instance until release(key).
- Release: a reusable instance goes back to the idle set as it is (the next chain's `reset(row)`
  starts its episode: one reset per chain, with the chain's row); others are closed and replaced
  in the background. A chain whose first call on a used instance is not a reset gets a reset
  without a row first; when that fails it is counted (`reset_failures`), the instance recycled
  and the call refused with the env's error.
- Recycling: an instance whose call crashed (EnvCrashed) or ran past its wall-clock limit is
  closed; the chain keeps its binding and gets a fresh instance at its next call.
- Lazy scale-up: instances beyond `warm` start only when a chain asks and all are busy.
"""

from __future__ import annotations

import collections
import itertools
import math
import time
from typing import Any, Callable, Hashable

import trio

from envservers import protocol
from envservers.env import EnvCrashed, ServerEnv

_instance_ids = itertools.count(1)


class PoolError(Exception):
  def __init__(self, error_type: str, message: str):
    super().__init__(message)
    self.error_type = error_type
    self.message = message


class CallTimeout(Exception):
  pass


class Instance:
  def __init__(self, env: ServerEnv):
    self.id = next(_instance_ids)
    self.env = env
    self.lock = trio.Lock()
    self.broken = False
    self.closing = False
    self.used = False  # released by a chain since its last reset (it holds that chain's state)


class _RateWindow:
  """Counts events per second over the last `seconds` seconds."""

  def __init__(self, seconds: int = 10):
    self.seconds = seconds
    self.buckets: collections.deque[list[int]] = collections.deque()

  def add(self, n: int = 1) -> None:
    now = int(time.monotonic())
    if self.buckets and self.buckets[-1][0] == now:
      self.buckets[-1][1] += n
    else:
      self.buckets.append([now, n])
    self._trim(now)

  def _trim(self, now: int) -> None:
    while self.buckets and self.buckets[0][0] <= now - self.seconds:
      self.buckets.popleft()

  def rate(self) -> float:
    self._trim(int(time.monotonic()))
    return sum(n for _, n in self.buckets) / self.seconds


class EnvPool:
  """Instances of one env type.

  `start(nursery)` begins warming (background tasks run in that nursery); `acquire`, `call`,
  `release` serve chains (keys are any hashable, the server uses (connection id, chain id));
  `aclose()` closes every instance.
  """

  def __init__(
    self,
    name: str,
    factory: Callable[[], ServerEnv],
    cap: int,
    warm: int = 1,
    call_timeout_s: float | None = None,
    start_timeout_s: float = 60.0,
  ):
    if cap < 1:
      raise ValueError(f"pool {name!r}: cap must be >= 1, got {cap}")
    self.name = name
    self.factory = factory
    self.cap = cap
    self.warm = max(0, min(warm, cap))
    self.call_timeout_s = call_timeout_s
    self.start_timeout_s = start_timeout_s
    self.idle: list[Instance] = []
    self.bound: dict[Hashable, Instance | None] = {}
    self.live = 0  # counted from reservation until close() finished
    self.starting = 0
    self.peak_live = 0
    self.counters = collections.Counter()
    self.rate = _RateWindow()
    self._changed = trio.Event()
    self._nursery: trio.Nursery | None = None
    self._closing = False

  # -- lifecycle --------------------------------------------------------------------------------

  def start(self, nursery: trio.Nursery) -> None:
    self._nursery = nursery
    self._top_up()

  async def aclose(self) -> None:
    """Closes every instance (idle and bound)."""
    self._closing = True
    instances = list(self.idle) + [i for i in self.bound.values() if i is not None]
    self.idle.clear()
    self.bound.clear()
    with trio.move_on_after(10) as scope:
      scope.shield = True
      async with trio.open_nursery() as nursery:
        for inst in instances:
          nursery.start_soon(self._close_instance, inst)

  def _notify(self) -> None:
    self._changed.set()
    self._changed = trio.Event()

  def _reserve(self) -> None:
    self.live += 1
    self.peak_live = max(self.peak_live, self.live)
    assert self.live <= self.cap, f"pool {self.name}: live {self.live} > cap {self.cap}"

  def _top_up(self) -> None:
    """Starts instances in the background until `warm` are idle or starting (cap permitting)."""
    if self._nursery is None or self._closing:
      return
    while len(self.idle) + self.starting < self.warm and self.live < self.cap:
      self._reserve()
      self.starting += 1
      self._nursery.start_soon(self._start_warm)

  async def _new_instance(self) -> Instance:
    """Creates and starts one instance; the caller has reserved a live slot."""
    env = None
    try:
      env = self.factory()
      with trio.fail_after(self.start_timeout_s):
        await env.start()
      return Instance(env)
    except BaseException as e:
      self.live -= 1
      self.counters["start_failures"] += 1
      self._notify()
      if env is not None:
        with trio.CancelScope(shield=True):
          await env.close()
      if isinstance(e, Exception):
        raise PoolError(protocol.ENV_ERROR, f"env {self.name!r} failed to start: {type(e).__name__}: {e}") from e
      raise

  async def _start_warm(self) -> None:
    try:
      inst = await self._new_instance()
    except PoolError:
      return
    finally:
      self.starting -= 1
    if self._closing:
      await self._close_instance(inst)
      return
    self.idle.append(inst)
    self._notify()

  async def _close_instance(self, inst: Instance) -> None:
    if inst.closing:  # e.g. released mid-call, then the failing call recycles it too
      return
    inst.closing = True
    try:
      with trio.CancelScope(shield=True):
        with trio.move_on_after(10):
          await inst.env.close()
    finally:
      self.live -= 1
      self._notify()
      self._top_up()

  # -- chains -----------------------------------------------------------------------------------

  async def acquire(self, key: Hashable, wait_s: float = 0.0) -> Instance:
    """The instance bound to `key`, binding one (idle, or newly started) if needed.

    Raises PoolError(POOL_EXHAUSTED) if all `cap` instances are in use for `wait_s` seconds.
    """
    if self._closing:
      raise PoolError(protocol.SHUTTING_DOWN, f"pool {self.name!r} is shutting down")
    inst = self.bound.get(key)
    if inst is not None:
      return inst
    deadline = trio.current_time() + max(0.0, wait_s)
    while True:
      if self.bound.get(key) is not None:  # a concurrent acquire for this key won
        return self.bound[key]
      if self.idle:
        inst = self.idle.pop()
        if not inst.env.alive():  # died while idle: replace it
          self.counters["recycled"] += 1
          inst.broken = True
          self._nursery.start_soon(self._close_instance, inst)
          continue
        break
      if self.live < self.cap:
        self._reserve()
        inst = await self._new_instance()
        break
      if trio.current_time() >= deadline and not self.starting:
        self.counters["exhausted"] += 1
        raise PoolError(protocol.POOL_EXHAUSTED, f"env {self.name!r}: all {self.cap} instances are in use; retry later")
      changed = self._changed
      # While an instance is starting, wait for it even past the deadline (it may be ours).
      with trio.move_on_at(math.inf if self.starting else deadline):
        await changed.wait()
    if self.bound.get(key) is not None:  # lost a race with a concurrent acquire of this key
      self.idle.append(inst)
      self._notify()
      return self.bound[key]
    self.bound[key] = inst
    self.counters["acquires"] += 1
    self._top_up()
    return inst

  async def release(self, key: Hashable) -> bool:
    """Unbinds `key`; returns False if it held nothing."""
    if key not in self.bound:
      return False
    inst = self.bound.pop(key)
    self.counters["releases"] += 1
    if inst is not None and self._nursery is not None:
      self._nursery.start_soon(self._recycle_or_reuse, inst)
    self._notify()
    return True

  async def _recycle_or_reuse(self, inst: Instance) -> None:
    if inst.broken or not inst.env.reusable or self._closing:
      await self._close_instance(inst)
      return
    inst.used = True
    self.idle.append(inst)  # no reset here: the next chain's reset(row) starts its episode
    self._notify()

  async def _reset_used(self, key: Hashable, inst: Instance, op: str) -> None:
    """Resets (without a row) a used instance whose chain called `op` before any reset; a failing
    reset is counted, recycles the instance and raises PoolError naming the env's error."""
    try:
      with trio.fail_after(self.call_timeout_s or inst.env.call_timeout_s):
        await inst.env.reset(None)
    except Exception as e:
      self.counters["reset_failures"] += 1
      self._recycle(key, inst)
      raise PoolError(
        protocol.ENV_ERROR,
        f"env {self.name!r}: the chain called {op!r} before reset, and resetting the reused instance "
        f"without a row failed ({type(e).__name__}: {e}); call reset(row) first",
      ) from e
    except BaseException:  # cancelled from outside mid-reset: its state is unknown
      self._recycle(key, inst)
      raise
    inst.used = False

  def release_all(self, keys) -> None:
    """Releases every key in `keys` (a closed connection's chains)."""
    for key in list(keys):
      if key in self.bound and self._nursery is not None:
        self._nursery.start_soon(self.release, key)

  async def call(
    self, key: Hashable, op: str, args: tuple = (), kwargs: dict | None = None, timeout_s: float | None = None
  ) -> tuple[Any, bool]:
    """Runs `env.<op>(*args, **kwargs)` on the chain's instance.

    Returns (result, restarted) where restarted says the chain got a fresh instance because its
    previous one crashed. Raises PoolError(NOT_ACQUIRED), CallTimeout or EnvCrashed (the
    instance is then recycled) or whatever the env raised.
    """
    if key not in self.bound:
      raise PoolError(protocol.NOT_ACQUIRED, f"chain {key[-1]!r} holds no {self.name!r} instance; call acquire first")
    restarted = False
    inst = self.bound[key]
    if inst is None:  # the previous instance was recycled: get a fresh one
      del self.bound[key]
      inst = await self.acquire(key, wait_s=30.0)
      restarted = True
    limit = self.call_timeout_s or inst.env.call_timeout_s
    if timeout_s is not None:
      limit = min(limit, float(timeout_s))
    self.counters["calls"] += 1
    self.rate.add()
    try:  # fast path without a scheduling round trip (a chain's calls rarely overlap)
      inst.lock.acquire_nowait()
    except trio.WouldBlock:
      await inst.lock.acquire()
    try:
      if inst.broken:
        raise EnvCrashed(f"env {self.name!r} instance {inst.id} was recycled")
      if inst.used and op != "reset":
        await self._reset_used(key, inst, op)
      try:
        # A bare CancelScope: trio.move_on_after's contextmanager costs more per call.
        with trio.CancelScope(deadline=trio.current_time() + limit) as scope:
          result = await getattr(inst.env, op)(*args, **(kwargs or {}))
      except EnvCrashed:
        self.counters["crashes"] += 1
        self._recycle(key, inst)
        raise
      except Exception:  # the env raised normally: it is still consistent
        self.counters["errors"] += 1
        raise
      except BaseException:  # cancelled from outside mid-call: its state is unknown
        self._recycle(key, inst)
        raise
      if scope.cancelled_caught:
        self.counters["timeouts"] += 1
        self._recycle(key, inst)
        raise CallTimeout(f"{self.name}.{op} ran past its {limit:g} s wall-clock limit")
      if op == "reset":
        inst.used = False
    finally:
      inst.lock.release()
    return result, restarted

  def _recycle(self, key: Hashable, inst: Instance) -> None:
    inst.broken = True
    self.counters["recycled"] += 1
    if self.bound.get(key) is inst:
      self.bound[key] = None
    if self._nursery is not None:
      self._nursery.start_soon(self._close_instance, inst)

  def stats(self) -> dict[str, Any]:
    in_use = sum(1 for i in self.bound.values() if i is not None)
    return {
      "cap": self.cap,
      "warm": self.warm,
      "live": self.live,
      "idle": len(self.idle),
      "starting": self.starting,
      "in_use": in_use,
      "chains": len(self.bound),
      "peak_live": self.peak_live,
      "calls_per_s": self.rate.rate(),
      **{
        k: self.counters[k]
        for k in (
          "acquires",
          "releases",
          "calls",
          "errors",
          "crashes",
          "timeouts",
          "recycled",
          "exhausted",
          "start_failures",
          "reset_failures",
        )
      },
    }
