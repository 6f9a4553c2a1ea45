"""A 2-step training run of each world config (webshop, textworld, scienceworld) through a real
local env server; metrics.jsonl carries the env pool metrics env/<type>/..."""

from __future__ import annotations

import os
import subprocess

import pytest

from train_cli import ROOT, read_metrics, train_command

SMALLEST = (
  "--config.train.steps=2",
  "--config.rollout.rows_per_step=1",
  "--config.rollout.num_chains=2",
  "--config.rollout.max_turns=2",
  "--config.rollout.max_tokens_per_turn=16",
  "--config.rollout.max_total_tokens=640",
  "--config.model.hidden_size=64",
  "--config.model.intermediate_size=128",
  "--config.model.num_layers=1",
  "--config.checkpoint.every=100",
)
# One small pool per run; scienceworld gets a single JVM that both chains share in turn.
REWARD_METRIC = {"webshop": "r_type", "textworld": "won", "scienceworld": "solved"}
LOCAL_ENVS = {"webshop": "webshop=2:0", "textworld": "textworld=2:0", "scienceworld": "scienceworld=1:0"}


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
    train_command(workdir, *SMALLEST, config=f"configs/{world}_grpo.py"),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
    env=env,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  records = [r for r in read_metrics(workdir) if "rollout/reward_mean" in r]
  assert [r["step"] for r in records] == [1, 2]
  for record in records:
    assert record[f"env/{world}/in_use"] >= 1  # chains held instances during the step
    assert record[f"env/{world}/cap"] == float(LOCAL_ENVS[world].split("=")[1].split(":")[0])
    assert record[f"env/{world}/crashes"] == 0
    assert f"env/{world}/acquire_wait_s" in record and f"env/{world}/warm" in record
    assert record.get("rollout/finish/error", 0.0) == 0.0  # env reset + env reward worked
    assert f"rollout/reward_metric/{REWARD_METRIC[world]}" in record
    assert record["rollout/turns_mean"] >= 1  # the opening observation fit: the policy acted
