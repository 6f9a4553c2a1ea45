"""configs/search_grpo.py and configs/math_grpo.py: any algorithm by flag, valid, and a 2-step
training run of each (random-init tiny policy; real env server for retrieve / code_interpreter)."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest

from agentfly_jax.rl.config import validate_config
from agentfly_jax.tasks import get_task
import subprocess

from train_cli import ENV_TASK_SMOKE, ROOT, read_metrics, train_command

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


def _load(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize(
  "name, task, tools, reward",
  [
    ("search_grpo", "multihop_qa", ["retrieve", "answer"], "f1"),
    ("math_grpo", "math_calc", ["code_interpreter", "answer"], "math_equal"),
  ],
)
def test_configs_name_their_task_and_take_any_algorithm(name, task, tools, reward):
  module = _load(name)
  config = module.get_config()
  assert config.task == task and config.algo == "grpo" and config.model.pretrained == ""
  validate_config(config)
  for algo in ("ppo", "rloo", "reinforce_pp", "drgrpo"):
    other = module.get_config(algo)
    assert other.algo == algo and other.task == task
    validate_config(other)
  task_module = get_task(task)
  assert [t.name for t in task_module.TOOLS] == tools and task_module.REWARD.name == reward
  rows = task_module.make_rows(4, seed=0)
  assert all(isinstance(r["question"], str) and r["answer"] for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["search_grpo", "math_grpo"])
def test_two_step_training_run(tmp_path, name):
  workdir = tmp_path / name
  out = subprocess.run(
    train_command(workdir, *ENV_TASK_SMOKE, "--config.train.steps=2", "--noresume", config=f"configs/{name}.py"),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=880,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  records = read_metrics(workdir)
  steps = [r for r in records if "rollout/reward_mean" in r]
  assert [r["step"] for r in steps] == [1, 2]
  for r in steps:
    assert math.isfinite(r["actor/entropy"]) and r["actor/n_tokens"] > 0
    assert 0.0 <= r["rollout/reward_mean"] <= 1.0
