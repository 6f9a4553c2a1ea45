"""It learns: from the shipped warm start (which mostly answers without calling the tool), a short
GRPO run on the multi-turn lookup task raises the success rate. The full curves (GRPO, PPO, RLOO,
REINFORCE++; 40 steps) are recorded by experiments/record_learning_curves.py."""
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_short_grpo_run_improves_success(tmp_path):
  import importlib.util
  from agentfly_jax.rl.trainer import Trainer
  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, "configs", "lookup_grpo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config()
  config.train.steps = 14
  config.eval.every = 0
  config.eval.num_rows = 0
  config.checkpoint.every = 100
  config.log.tensorboard = False
  config.log.progress = False
  records = Trainer(config, str(tmp_path / "run")).train()
  success = [r["rollout/success_rate"] for r in records if "rollout/success_rate" in r]
  tool_use = [r["rollout/tool_calls_per_chain"] for r in records if "rollout/tool_calls_per_chain" in r]
  assert len(success) == 14
  first, last = np.mean(success[:3]), np.mean(success[-3:])
  assert first <= 0.6, success
  assert last >= first + 0.2, success
  assert np.mean(tool_use[-3:]) > np.mean(tool_use[:3]), tool_use
  assert os.path.getsize(tmp_path / "run" / "reward.png") > 1000
