"""A short run with DAPO knobs on (overlong penalty, clip-higher; dynamic sampling is unit-tested in
test_rl_batching.py) and a KL
penalty to the step-0 reference, experiments/evaluate.py on its checkpoint, then a resume past it
(the reference policy is restored from its own checkpoint)."""
import json
import os
import subprocess
import sys

import pytest
from train_cli import ROOT, run_train


@pytest.mark.slow
def test_dapo_run_then_evaluate(tmp_path):
  workdir = tmp_path / "run"
  overrides = ["--config.rollout.rows_per_step=4", "--config.rollout.num_chains=4",
               "--config.dapo.overlong_buffer=8", "--config.loss.clip_high=0.28", "--config.loss.kl_coef=0.01"]
  recs = run_train(workdir, "--config.train.steps=2", *overrides)
  assert [r["step"] for r in recs] == [1, 2]
  assert all("dapo/overlong_penalty_mean" in r and "actor/kl_ref" in r for r in recs)
  assert recs[0]["actor/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
  ev = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "evaluate.py"), f"--workdir={workdir}",
                       "--num_rows=8", "--num_chains=2", "--temperature=1.0"],
                      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert ev.returncode == 0, ev.stderr[-3000:]
  result = json.loads((workdir / "eval_step2.json").read_text())
  assert result["step"] == 2 and 0.0 <= result["eval/success_rate"] <= 1.0
  assert "eval/pass@2" in result and result["eval/num_chains"] == 16
  recs = run_train(workdir, "--config.train.steps=3", *overrides)  # resumes from step 2
  assert [r["step"] for r in recs] == [1, 2, 3] and recs[2]["actor/kl_ref"] > 0
