"""The swe task on the trainer side: the config builds its task (tools, rows, the agent with the
config's tool prompt), bad rows stop before training, and a 2-step GRPO run of configs/swe_grpo.py
through a real local env server (slow)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests import swe_testlib
from train_cli import ENV_TASK_SMOKE, ROOT, read_metrics, train_command

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


def _config():
  from configs import swe_grpo

  return swe_grpo.get_config()


def test_config_builds_the_swe_task_with_its_tool_prompt():
  from agentfly_jax.tasks.from_config import build_task
  from agentfly_jax.rl.config import validate_config

  config = _config()
  validate_config(config)
  task = build_task(config)
  assert [t.name for t in task.tools] == ["bash", "view", "str_replace", "submit"]
  assert task.tools[-1].is_finish and task.reward.name == "swe_hidden_tests"
  train = {r["task_id"] for r in task.rows}
  dev = {r["task_id"] for r in task.make_eval_rows(100, 0)}  # the evals during training read dev, not test
  test = {r["task_id"] for r in task.make_test_rows(100, 0)}
  assert len(dev) == config.eval.num_rows == 7 and len(test) == 18 and not (train & dev or train & test or dev & test)
  assert task.system_prompt == config.task.system_prompt and "str_replace" in task.system_prompt


def test_bad_user_rows_stop_before_training(tmp_path):
  from agentfly_jax.tasks.from_config import build_task

  good = swe_testlib.make_task(tmp_path / "t")
  rows = tmp_path / "rows.jsonl"
  rows.write_text(
    json.dumps({**good, "question": "fix it"})
    + "\n"
    + json.dumps({**good, "question": "fix it", "repo": str(tmp_path / "gone")})
    + "\n"
  )
  config = _config()
  config.task.train_path = str(rows)
  with pytest.raises(ValueError, match=r"rows.jsonl row 1: field 'repo': folder .*gone.* does not exist"):
    build_task(config)


@pytest.mark.slow
def test_two_training_steps_of_swe_grpo(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("train_swe")
  env = dict(os.environ, AGENTFLY_LOCAL_ENVS="swe=2:0")
  env.pop("AGENTFLY_ENV_SERVERS", None)
  out = subprocess.run(
    train_command(workdir, *ENV_TASK_SMOKE, "--config.train.steps=2", config="configs/swe_grpo.py"),
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
    assert record["env/swe/in_use"] >= 1 and record["env/swe/crashes"] == 0
    assert record.get("rollout/finish/error", 0.0) == 0.0  # env reset + env reward worked
    assert "rollout/reward_metric/total" in record and record["rollout/reward_metric/total"] >= 1
    assert record["rollout/turns_mean"] >= 1  # the issue fit in the prompt: the policy acted
