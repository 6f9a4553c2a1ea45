"""Router replay through the whole loop: a tiny random-init Qwen3-MoE policy on the lookup task, sampled by the
paged engine (which records every fed token's routed experts), trained with `model.router_replay=rollout`:
the trajectories carry the routes, the train step routes by them and reports router/rollout_mismatch; a
sampler that records no routes is refused by name (tests/rl/test_moe_spec.py)."""

import numpy as np
import pytest

from agentfly_jax.rl.config import task_config

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


def _config(**overrides):
  c = task_config(
    "lookup",
    "grpo",
    **{
      "model.family": "qwen3_moe",
      "model.hidden_size": 32,
      "model.num_layers": 2,
      "model.num_heads": 2,
      "model.num_kv_heads": 1,
      "model.head_dim": 16,
      "model.num_experts": 4,
      "model.num_experts_per_tok": 2,
      "model.moe_intermediate_size": 32,
      "model.vocab_size": 512,
      "model.router_replay": "rollout",
      "loss.router_aux_coef": 0.01,  # a gradient even where a random policy's rewards are all alike
      "rollout.rows_per_step": 2,
      "rollout.num_chains": 2,
      "rollout.max_turns": 2,
      "rollout.max_tokens_per_turn": 8,
      "rollout.max_total_tokens": 512,
      "train.steps": 2,
      "train.micro_batch_size": 4,
      "sft.steps": 0,
      "eval.every": 0,
      "eval.num_rows": 0,
      "checkpoint.every": 100,
      **overrides,
    },
  )
  c.log.progress = c.log.tensorboard = False
  return c


@pytest.mark.slow
def test_a_moe_policy_trains_with_replayed_routes(tmp_path):
  from agentfly_jax.rl.trainer import Trainer

  trainer = Trainer(_config(), str(tmp_path / "run"))
  records = trainer.train()
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    assert np.isfinite(r["actor/pg_loss"]) and np.isfinite(r["router/aux_loss"]) and r["actor/grad_norm"] > 0
    # the sampler routed on the weights the trainer starts the step from
    assert 0.0 <= r["router/rollout_mismatch"] < 0.05
  # the train step ran on micro-batches holding the replayed routes
  assert any("routed_experts" in keys for keys in trainer.run.update._steps)
  # every token of a chain but its last was fed to the engine: each has its 2 layers' top 2 experts
  for t in trainer.rollout(trainer.run.parts.train_stream.at(0, 2), num_chains=1):
    assert t.routed_experts.shape == (len(t.token_ids) - 1, 2, 2)
