"""A training run of each world config (webshop, textworld, scienceworld) through a real local env
server; metrics.jsonl carries the env pool metrics env/<type>/... The worlds differ in their env
server only (reset, step, reward), which one step shows; webshop's run takes a second step on the same
pool."""

from __future__ import annotations

import os
import subprocess

import pytest

from train_cli import ENV_TASK_SMOKE, ROOT, read_metrics, train_command

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

# One small pool per run; scienceworld gets a single JVM that both chains share in turn.
REWARD_METRIC = {"webshop": "r_type", "textworld": "won", "scienceworld": "solved"}
LOCAL_ENVS = {"webshop": "webshop=2:0", "textworld": "textworld=2:0", "scienceworld": "scienceworld=1:0"}
# textworld generates one game per row (~5-10 s each), scienceworld's JVM is slow per call
STEPS = {"webshop": 2, "textworld": 1, "scienceworld": 1}


@pytest.mark.slow
@pytest.mark.parametrize("world", ["webshop", "textworld", pytest.param("scienceworld", marks=pytest.mark.jvm)])
def test_two_training_steps_log_env_pool_metrics(world, tmp_path_factory):
  workdir = tmp_path_factory.mktemp(f"train_{world}")
  shared = tmp_path_factory.getbasetemp()
  env = dict(
    os.environ, AGENTFLY_LOCAL_ENVS=LOCAL_ENVS[world], AGENTFLY_TEXTWORLD_CACHE=str(shared / "textworld_games_train")
  )
  env.pop("AGENTFLY_ENV_SERVERS", None)
  out = subprocess.run(
    train_command(workdir, *ENV_TASK_SMOKE, f"--config.train.steps={STEPS[world]}", config=f"configs/{world}_grpo.py"),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
    env=env,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  records = [r for r in read_metrics(workdir) if "rollout/reward_mean" in r]
  assert [r["step"] for r in records] == list(range(1, STEPS[world] + 1))
  for record in records:
    assert record[f"env/{world}/in_use"] >= 1  # chains held instances during the step
    assert record[f"env/{world}/cap"] == float(LOCAL_ENVS[world].split("=")[1].split(":")[0])
    assert record[f"env/{world}/crashes"] == 0
    assert f"env/{world}/acquire_wait_s" in record and f"env/{world}/warm" in record
    assert record.get("rollout/finish/error", 0.0) == 0.0  # env reset + env reward worked
    assert f"rollout/reward_metric/{REWARD_METRIC[world]}" in record
    assert record["rollout/turns_mean"] >= 1  # the opening observation fit: the policy acted
