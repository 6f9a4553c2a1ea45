"""env/<type>/... pool metrics: summed over servers, acquire waits and peaks per type."""

from __future__ import annotations

import numpy as np
import pytest

from agentfly_jax.envs.pool_metrics import env_pool_metrics, pool_metrics_from_stats


def test_metrics_sum_servers_and_average_waits_on_random_inputs():
  rng = np.random.default_rng(7)
  keys = ("in_use", "idle", "live", "cap", "crashes", "recycled", "timeouts", "start_failures", "reset_failures")
  stats = {
    f"10.0.0.{i}:1": {"pools": {env: {k: int(rng.integers(0, 50)) for k in keys} for env in ("webshop", "textworld")}}
    for i in range(3)
  }
  stats["10.0.0.9:1"] = {"error": "unreachable"}
  waits = {"webshop": list(rng.uniform(0, 2, size=5)), "scienceworld": []}
  peaks = {"webshop": 7, "textworld": 3}
  out = pool_metrics_from_stats(stats, waits, peaks)
  for env in ("webshop", "textworld"):
    pools = [s["pools"][env] for s in stats.values() if "pools" in s]
    assert out[f"env/{env}/warm"] == sum(p["idle"] for p in pools)
    assert out[f"env/{env}/in_use_now"] == sum(p["in_use"] for p in pools)
    assert out[f"env/{env}/crashes"] == sum(p["crashes"] for p in pools)
    assert out[f"env/{env}/reset_failures"] == sum(p["reset_failures"] for p in pools)
    assert out[f"env/{env}/in_use"] == peaks[env]
  assert out["env/webshop/acquire_wait_s"] == pytest.approx(np.mean(waits["webshop"]))
  assert out["env/webshop/acquire_wait_max_s"] == pytest.approx(max(waits["webshop"]))
  assert out["env/webshop/acquires"] == 5
  assert out["env/scienceworld/acquires"] == 0 and out["env/scienceworld/cap"] == 0
  assert all(isinstance(v, float) for v in out.values())


def test_non_manager_providers_report_nothing():
  assert env_pool_metrics(None) == {}
  assert env_pool_metrics(object()) == {}
