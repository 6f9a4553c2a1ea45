"""It learns a skill: the shipped warm start mostly answers without calling the tool (its greedy
held-out success is ~0: it never looks the code up), and a short GRPO run on the multi-turn lookup
task makes the greedy policy call the tool and copy the code (greedy success >= 0.8). The same holds
for the tiny mixture-of-experts policy (configs/lookup_grpo_moe.py: its own warm start, trained on the
rollout's recorded routes: the trajectories carry them, the train step routes by them). The full demo
(40 steps, 3 seeds) and GRPO / PPO / RLOO / REINFORCE++ on the locked test keys are recorded by
experiments/learning_report.py (lab/results/LEARNING.md)."""

import os

import numpy as np
import pytest
from train_cli import ROOT

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

STEPS = 12


def _train_and_check(config_file, workdir):
  """Trains `config_file` STEPS GRPO steps with greedy evals at step 0 and the last, checks that it
  learned, and returns the trainer and its step records."""
  import importlib.util

  from agentfly_jax.rl.trainer import Trainer

  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, "configs", config_file))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config()
  config.train.steps = STEPS
  config.eval.every = STEPS  # greedy eval at step 0 and the last step
  config.eval.num_rows = 32
  config.checkpoint.every = 0  # the last step only
  config.log.tensorboard = False
  config.log.progress = False
  trainer = Trainer(config, str(workdir))
  records = trainer.train()
  greedy = {r["step"]: r["eval/success_rate"] for r in records if "eval/success_rate" in r}
  success = [r["rollout/success_rate"] for r in records if "rollout/success_rate" in r]
  tool_use = [r["rollout/tool_calls_per_chain"] for r in records if "rollout/tool_calls_per_chain" in r]
  assert sorted(greedy) == [0, STEPS] and len(success) == STEPS
  assert greedy[0] <= 0.5, greedy  # the warm start's greedy answer is a guess
  assert greedy[STEPS] >= 0.8, greedy  # after RL the greedy policy looks the code up
  assert np.mean(success[-3:]) >= np.mean(success[:3]) + 0.2, success
  assert np.mean(tool_use[-3:]) > np.mean(tool_use[:3]), tool_use
  assert os.path.getsize(workdir / "reward.png") > 1000
  assert max(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit()) == STEPS
  return trainer, records


@pytest.mark.slow
def test_short_grpo_run_learns_to_use_the_tool(tmp_path):
  _train_and_check("lookup_grpo.py", tmp_path / "run")


@pytest.mark.slow
def test_a_moe_policy_learns_to_use_the_tool_with_replayed_routes(tmp_path):
  trainer, records = _train_and_check("lookup_grpo_moe.py", tmp_path / "run")
  steps = [r for r in records if "actor/pg_loss" in r]
  assert len(steps) == STEPS
  for r in steps:
    assert np.isfinite(r["actor/pg_loss"]) and r["actor/grad_norm"] > 0, r
    assert np.isfinite(r["router/aux_loss"]) and np.isfinite(r["router/expert_load_max"]), r
    assert r["router/dropped_tokens"] == 0.0
    # the sampler routed on the weights the trainer starts the step from, and the step trained on its routes
    assert 0.0 <= r["router/rollout_mismatch"] < 0.05, r
  # the train step ran on micro-batches holding the replayed routes
  assert any("routed_experts" in keys for keys in trainer.run.update._steps)
  # every token of a chain but its last was fed to the engine: each has its 2 layers' top 2 experts
  for t in trainer.rollout(trainer.run.parts.train_stream.at(0, 2), num_chains=1):
    assert t.routed_experts.shape == (len(t.token_ids) - 1, 2, 2)
