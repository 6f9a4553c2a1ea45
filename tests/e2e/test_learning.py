"""It learns a skill: the shipped warm start mostly answers without calling the tool (its greedy
held-out success is ~0: it never looks the code up), and a short GRPO run on the multi-turn lookup
task makes the greedy policy call the tool and copy the code (greedy success >= 0.8). The full
demo (40 steps, 3 seeds) and GRPO / PPO / RLOO / REINFORCE++ on the locked test keys are recorded by
experiments/learning_report.py (lab/results/LEARNING.md)."""

import os

import numpy as np
import pytest
from train_cli import ROOT

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.mark.slow
def test_short_grpo_run_learns_to_use_the_tool(tmp_path):
  import importlib.util
  from agentfly_jax.rl.trainer import Trainer

  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, "configs", "lookup_grpo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config()
  config.train.steps = 12
  config.eval.every = 12  # greedy eval at step 0 and step 12
  config.eval.num_rows = 32
  config.checkpoint.every = 0  # the last step only
  config.log.tensorboard = False
  config.log.progress = False
  records = Trainer(config, str(tmp_path / "run")).train()
  greedy = {r["step"]: r["eval/success_rate"] for r in records if "eval/success_rate" in r}
  success = [r["rollout/success_rate"] for r in records if "rollout/success_rate" in r]
  tool_use = [r["rollout/tool_calls_per_chain"] for r in records if "rollout/tool_calls_per_chain" in r]
  assert sorted(greedy) == [0, 12] and len(success) == 12
  assert greedy[0] <= 0.5, greedy  # the warm start's greedy answer is a guess
  assert greedy[12] >= 0.8, greedy  # after RL the greedy policy looks the code up
  assert np.mean(success[-3:]) >= np.mean(success[:3]) + 0.2, success
  assert np.mean(tool_use[-3:]) > np.mean(tool_use[:3]), tool_use
  assert os.path.getsize(tmp_path / "run" / "reward.png") > 1000
  assert sorted(int(d) for d in os.listdir(tmp_path / "run" / "checkpoints") if d.isdigit())[-1] == 12
