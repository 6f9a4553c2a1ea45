"""Env-pool metrics for the training logs: per env type, summed over the env servers.

`mark = env_usage_mark(provider)` before a step's rollout, then `env_pool_metrics(provider, mark)`
-> {"env/<type>/in_use": ..., "env/<type>/warm": ..., ...} (reading resets nothing):
  in_use      most of this trainer's chains bound at once since the mark
  in_use_now  instances bound on the servers now     warm        idle started instances
  live        instances alive (any state)            cap         the pools' caps
  crashes     calls that crashed an instance         recycled    instances closed and replaced
  timeouts    calls past their wall-clock limit      start_failures
  reset_failures  resets of reused instances (a chain's first call not a reset) that failed
  acquire_wait_s / acquire_wait_max_s   mean / max seconds this trainer's acquires waited since
                                        the mark (client side, back-off included)
Counters are cumulative since each server started. And this trainer's own (client-side) counts
since the mark, `env/client/<counter>` (envs.manager.COUNTERS): acquires, connects,
reconnects, connection_errors (a server gone mid-call or refusing connections), timeouts (a hung
server), errors, pool_full, ... Only an `EnvManager` (env servers) reports; any other provider
gives {}.
"""

from __future__ import annotations

import collections
import logging

import trio

from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.envs.provider import DeferredEnvProvider

log = logging.getLogger(__name__)
POOL_KEYS = {
  "in_use_now": "in_use",
  "warm": "idle",
  "live": "live",
  "cap": "cap",
  "crashes": "crashes",
  "recycled": "recycled",
  "timeouts": "timeouts",
  "start_failures": "start_failures",
  "reset_failures": "reset_failures",
}


def _reporting(provider):
  """The EnvManager behind `provider` (a DeferredEnvProvider reports what it resolved to), or None."""
  if isinstance(provider, DeferredEnvProvider):
    provider = provider.current()
  return provider if isinstance(provider, EnvManager) else None


def pool_metrics_from_stats(
  stats: dict[str, dict], waits: dict[str, list[float]], peaks: dict[str, int]
) -> dict[str, float]:
  """Flat metrics from servers' `stats` replies ({address: reply}), acquire waits and peak
  bound chains per env type."""
  totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for reply in stats.values():
    for env_name, pool in (reply.get("pools") or {}).items():
      for key, source in POOL_KEYS.items():
        totals[env_name][key] += float(pool.get(source, 0))
  out = {}
  for env_name in sorted(set(totals) | set(waits) | set(peaks)):
    out[f"env/{env_name}/in_use"] = float(peaks.get(env_name, 0))
    for key in POOL_KEYS:
      out[f"env/{env_name}/{key}"] = float(totals[env_name][key])
    w = waits.get(env_name) or []
    out[f"env/{env_name}/acquires"] = float(len(w))
    out[f"env/{env_name}/acquire_wait_s"] = float(sum(w) / len(w)) if w else 0.0
    out[f"env/{env_name}/acquire_wait_max_s"] = float(max(w)) if w else 0.0
  return out


def env_usage_mark(provider):
  """A mark of `provider`'s client-side usage (EnvManager.usage_mark) to report a step's own
  acquires from; None for a provider that does not report (or a deferred one not resolved yet:
  its manager is made by the step, whose report then counts from its start)."""
  provider = _reporting(provider)
  return provider.usage_mark() if provider is not None else None


def env_pool_metrics(provider, since=None) -> dict[str, float]:
  """Per-env-type pool metrics of `provider`'s servers (see the module docstring), the client
  side since the mark `since` (`env_usage_mark`); {} for a provider that is not an EnvManager or
  when called inside a trio run. Never raises."""
  provider = _reporting(provider)
  if provider is None:
    return {}
  try:
    trio.lowlevel.current_task()
    return {}  # inside trio: the caller must await provider.server_stats() itself
  except RuntimeError:
    pass
  usage = provider.usage_since(since)  # before the stats calls' own connects
  try:
    stats = trio.run(provider.server_stats)
  except Exception:  # noqa: BLE001 -- metrics must never stop training
    log.warning("env pool metrics: could not read server stats", exc_info=True)
    stats = {}
  out = pool_metrics_from_stats(stats, usage.waits, usage.peaks)
  out.update({f"env/client/{key}": float(n) for key, n in usage.counters.items()})
  return out
