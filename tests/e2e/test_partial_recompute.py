"""Partial rollouts on the paged engine with rollout.weight_update="recompute" (the demo config,
configs/lookup_grpo.py, at test_async_rollout.py's test size): the producer loads each published version
without draining the requests in flight (the engine recomputes their keys / values on the new weights), and the
run trains, keeps every trained turn within the staleness bound (checked on every batch by the producer and in
the metrics here) and trains every turn it sampled."""

import importlib.util
import os

import pytest
from train_cli import ROOT

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

STEPS, MAX_STALENESS = 4, 1


@pytest.fixture(scope="module")
def recompute_run(tmp_path_factory):
  """(trainer, records) of one 4-step partial run, max_staleness 1, on the engine in recompute mode."""
  from agentfly_jax.rl.trainer import Trainer

  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, "configs", "lookup_grpo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.train.steps = STEPS
  c.rollout.rows_per_step, c.rollout.num_chains, c.rollout.max_turns = 2, 4, 2
  c.rollout.max_tokens_per_turn = 16
  c.train.micro_batch_size = 8
  c.loss.entropy_coef = 0.05
  c.rollout.mode, c.rollout.max_staleness, c.rollout.partial = "async", MAX_STALENESS, True
  c.rollout.sampler, c.rollout.weight_update = "jax", "recompute"
  c.eval.every, c.eval.num_rows = 0, 0
  c.checkpoint.every = 100
  c.log.tensorboard = c.log.progress = False
  trainer = Trainer(c, str(tmp_path_factory.mktemp("partial_recompute") / "run"))
  return trainer, trainer.train()


@pytest.mark.slow
def test_partial_run_on_the_recomputing_engine_trains(recompute_run):
  trainer, records = recompute_run
  assert trainer.run.parts.sampler.engine_config.weight_update == "recompute"
  assert [r["step"] for r in records] == list(range(1, STEPS + 1))
  assert trainer.run.loss_cfg.policy_loss == "decoupled_ppo"
  assert all("actor/behaviour_weight_mean" in r for r in records)
  assert any(r["actor/grad_norm"] > 0 for r in records)
  assert records[-1]["async/weight_loads"] >= 1  # published versions were loaded mid-stream


@pytest.mark.slow
def test_partial_run_on_the_recomputing_engine_keeps_the_bound_and_wastes_no_turn(recompute_run):
  _, records = recompute_run
  for r in records:
    assert 0 <= r["async/staleness"] <= MAX_STALENESS, r
    assert sum(r[f"async/staleness_hist/{k}"] for k in range(MAX_STALENESS + 1)) == pytest.approx(1)
  # every turn the engine sampled was trained: at the last step nothing is in flight and nothing left over
  last = records[-1]
  assert last["async/trained_turns"] == last["async/sampled_turns"] > 0, last
  trained = sum(r["rollout/turns_mean"] * r["rollout/num_chains"] for r in records)  # the batches' model turns
  assert last["async/trained_turns"] == pytest.approx(trained)
