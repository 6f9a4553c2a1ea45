"""Per-tool limits and counters: a concurrency cap, a call rate, and what waiting on them cost.

  @tool(max_concurrency=2, rate=(5, 1.0))   # at most 2 calls at once, at most 5 starts per second
  def paid_search(query: str) -> str: ...

Every `Tool` owns a `ToolLimits`; a call waits for a concurrency slot first, then for the rate
(so the moment it is let through is the moment it starts: at most `calls` starts in any window
of `seconds`). The waits and the outcomes are counted per tool, cumulatively; reading never
resets them. `since = tool_counts(tools)` takes a snapshot, and `tool_metrics(tools, since)` the
counts after it (the trainer's step metrics; without `since`: since the tools were made):
  tools/<name>/calls    calls that ran (after any wait)
  tools/<name>/errors   of those, calls that gave an error observation
  tools/<name>/wait_s   seconds the calls spent waiting for the limits, summed
  tools/<name>/wait_max_s   the longest single wait

The trio primitives are made per trio run (a trainer step is its own `trio.run`), so one tool
object serves any number of runs; the rate window is kept across runs in wall-clock time.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from typing import Iterable

import trio


def _check_limits(name: str, max_concurrency, rate) -> tuple[int | None, tuple[int, float] | None]:
  if max_concurrency is not None and (
    isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1
  ):
    raise ValueError(f"@tool {name!r}: max_concurrency must be an int >= 1 (or None), got {max_concurrency!r}")
  if rate is not None:
    ok = (
      isinstance(rate, (tuple, list))
      and len(rate) == 2
      and isinstance(rate[0], int)
      and not isinstance(rate[0], bool)
      and rate[0] >= 1
      and isinstance(rate[1], (int, float))
      and rate[1] > 0
    )
    if not ok:
      raise ValueError(f"@tool {name!r}: rate must be (calls: int >= 1, seconds: > 0), got {rate!r}")
    rate = (int(rate[0]), float(rate[1]))
  return max_concurrency, rate


class ToolLimits:
  """A tool's concurrency cap and rate, and its counters (thread-safe: rollouts may run in other
  threads, e.g. the async trainer's producer)."""

  def __init__(self, name: str, max_concurrency: int | None = None, rate: tuple[int, float] | None = None):
    self.name = name
    self.max_concurrency, self.rate = _check_limits(name, max_concurrency, rate)
    self._lock = threading.Lock()
    self._run_token = None  # the trio run the primitives below belong to
    self._slots: trio.CapacityLimiter | None = None
    self._rate_lock: trio.Lock | None = None
    self._starts: collections.deque[float] = collections.deque()  # time.monotonic() of recent starts
    self._counts = ToolCounts()
    self._waits: list[float] = []  # every wait, in order (a snapshot's max is over those after it)

  @property
  def limited(self) -> bool:
    return self.max_concurrency is not None or self.rate is not None

  def _primitives(self):
    token = trio.lowlevel.current_trio_token()
    with self._lock:
      if self._run_token is not token:
        self._run_token = token
        self._slots = trio.CapacityLimiter(self.max_concurrency) if self.max_concurrency else None
        self._rate_lock = trio.Lock() if self.rate else None
      return self._slots, self._rate_lock

  async def _wait_rate(self, rate_lock: trio.Lock) -> None:
    calls, seconds = self.rate
    async with rate_lock:  # one waiter at a time: starts are let through in arrival order
      while True:
        now = time.monotonic()
        with self._lock:
          while self._starts and now - self._starts[0] >= seconds:
            self._starts.popleft()
          if len(self._starts) < calls:
            self._starts.append(now)
            return
          free_at = self._starts[0] + seconds
        await trio.sleep(max(0.0, free_at - now))

  @contextlib.asynccontextmanager
  async def slot(self):
    """Waits for the limits, counts the wait; the body is the call."""
    if not self.limited:
      yield
      return
    slots, rate_lock = self._primitives()
    t0 = time.monotonic()
    async with slots if slots is not None else contextlib.nullcontext():
      if rate_lock is not None:
        await self._wait_rate(rate_lock)
      waited = time.monotonic() - t0
      with self._lock:
        c = self._counts
        self._counts = ToolCounts(c.calls, c.errors, c.wait_s + waited, c.waits + 1)
        self._waits.append(waited)
      yield

  def count(self, ok: bool) -> None:
    """Counts one call that ran (ok: no error observation)."""
    with self._lock:
      c = self._counts
      self._counts = ToolCounts(c.calls + 1, c.errors + (0 if ok else 1), c.wait_s, c.waits)

  def counts(self) -> "ToolCounts":
    """The cumulative counts (a snapshot; reading changes nothing)."""
    with self._lock:
      return self._counts

  def since(self, before: "ToolCounts") -> dict[str, float]:
    """{calls, errors, wait_s, wait_max_s} of what happened after the snapshot `before`."""
    with self._lock:
      now, waits = self._counts, self._waits[before.waits :]
    return {
      "calls": now.calls - before.calls,
      "errors": now.errors - before.errors,
      "wait_s": now.wait_s - before.wait_s,
      "wait_max_s": max(waits, default=0.0),
    }


@dataclasses.dataclass(frozen=True)
class ToolCounts:
  """A tool's cumulative counts: calls that ran, of those errors, seconds waited for the limits,
  number of waits."""

  calls: int = 0
  errors: int = 0
  wait_s: float = 0.0
  waits: int = 0


def _limited(tools: Iterable):
  return [t for t in tools if getattr(t, "limits", None) is not None]


def tool_counts(tools: Iterable) -> dict[str, ToolCounts]:
  """A snapshot of `tools`' counts, {tool name: ToolCounts}, for `tool_metrics(tools, since=...)`."""
  return {t.name: t.limits.counts() for t in _limited(tools)}


def tool_metrics(tools: Iterable, since: dict[str, ToolCounts] | None = None) -> dict[str, float]:
  """{"tools/<name>/calls", ".../errors", ".../wait_s", ".../wait_max_s"} of `tools` after the
  snapshot `since` (`tool_counts`; None or a tool missing from it: since the tool was made); tools
  with no calls and no waits in that span are left out."""
  out = {}
  for t in _limited(tools):
    counts = t.limits.since((since or {}).get(t.name, ToolCounts()))
    if not counts["calls"] and not counts["wait_s"]:
      continue
    for key, value in counts.items():
      out[f"tools/{t.name}/{key}"] = float(value)
  return out
