"""The turn-level estimators train through the whole loop: GRPO-style with GiGPO's step-level
baseline, and PPO with turn-level GAE (the turn arrays travel host -> prepare -> advantages)."""

import os

import numpy as np
import pytest
from train_cli import ROOT

from agentfly_jax.rl.config import lookup_config

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.mark.slow
@pytest.mark.parametrize("algo,estimator", [("grpo", "gigpo"), ("ppo", "turn_gae")])
def test_turn_estimators_train(tmp_path, algo, estimator):
  from agentfly_jax.rl.trainer import Trainer

  c = lookup_config(algo, os.path.join(ROOT, "experiments", "results", "lookup_warmstart"))
  c.train.steps = 2
  c.rollout.rows_per_step, c.rollout.num_chains, c.rollout.max_turns = 2, 4, 2
  c.rollout.max_tokens_per_turn = 16
  c.train.micro_batch_size = 8
  c.loss.estimator = estimator
  c.eval.every, c.eval.num_rows = 0, 0
  c.checkpoint.every = 100
  c.log.tensorboard = c.log.progress = False
  records = Trainer(c, str(tmp_path)).train()
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    assert np.isfinite(r["actor/pg_loss"]) and np.isfinite(r["adv/abs_mean"])
  if algo == "ppo":  # the critic's values make advantages even where every reward is 0
    assert all(r["adv/abs_mean"] > 0 for r in records) and records[-1]["actor/grad_norm"] > 0
