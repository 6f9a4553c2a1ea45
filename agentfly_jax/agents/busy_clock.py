"""Wall time during which some work was in progress, across concurrent chains and threads.

    with SAMPLER_CLOCK:                  # around each sampler call of every chain
      result = await sampler.agenerate(ids, params)
    busy = SAMPLER_CLOCK.busy_s()        # seconds with >= 1 call in flight, since the process began

Concurrent chains overlap, so a sum of per-call times exceeds the wall; a clock counts the union of
the intervals instead (busy while at least one holder is inside), so a clock's difference over a
span of wall time is never larger than that span. The rollout holds `SAMPLER_CLOCK` around sampler
calls and `ENV_CLOCK` around tool calls, environment acquires / resets and reward computation; the
trainer reports their differences per step (rl/throughput.py).
"""

from __future__ import annotations

import threading
import time


class BusyClock:
  """A monotone counter of busy wall seconds; re-entrant and thread-safe (`with clock:`)."""

  def __init__(self, name: str):
    self.name = name
    self._lock = threading.Lock()
    self._active = 0
    self._since = 0.0
    self._total = 0.0

  def __enter__(self) -> "BusyClock":
    with self._lock:
      if self._active == 0:
        self._since = time.perf_counter()
      self._active += 1
    return self

  def __exit__(self, *exc) -> None:
    with self._lock:
      self._active -= 1
      if self._active == 0:
        self._total += time.perf_counter() - self._since

  def busy_s(self) -> float:
    """Busy seconds so far (an interval still open counts up to now)."""
    with self._lock:
      open_s = time.perf_counter() - self._since if self._active else 0.0
      return self._total + open_s


SAMPLER_CLOCK = BusyClock("sampler")
ENV_CLOCK = BusyClock("env")
