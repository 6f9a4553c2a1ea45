"""A run saved by an older version of the code still evaluates and resumes with today's.

tests/data/run_saved_by_0e48eb0/ is a whole 1-step run directory (config.json, task.json, the
tokenizer, the orbax checkpoint of step 1 and the KL reference) written by commit 0e48eb0 (the
code before this wave's config fields: LoRA, scanned layers, black-box agents, MCP servers):
experiments/train.py --config=configs/lookup_grpo.py --config.model.pretrained="" with a 1-layer
32-wide policy, 1 step, 2 rows x 2 chains, kl_coef 0.01. Config fields added since are absent
from its config.json and must take their defaults."""

import json
import shutil
import subprocess
import sys

import pytest
from train_cli import QUIET, ROOT, TESTS_DIR, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.fast_compile]


@pytest.fixture
def old_run(tmp_path):
  run = tmp_path / "run"
  shutil.copytree(f"{TESTS_DIR}/data/run_saved_by_0e48eb0", run)
  return run


def test_old_run_evaluates_and_resumes(old_run):
  saved = json.loads((old_run / "config.json").read_text())
  assert "lora" not in saved["model"] and "scan_layers" not in saved["model"]  # truly older
  ev = subprocess.run(
    # the lookup task's rows changed since (locked splits): evaluated on today's, said so
    [sys.executable, f"{ROOT}/experiments/evaluate.py", f"--workdir={old_run}", "--num_rows=2", "--allow_changed_task"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert ev.returncode == 0, ev.stderr[-3000:]
  assert "evaluating on today's task" in ev.stderr
  result = json.loads((old_run / "eval_step1.json").read_text())
  assert result["step"] == 1 and result["eval/num_chains"] == 2
  out = subprocess.run(
    [
      sys.executable,
      f"{ROOT}/experiments/train.py",
      f"--config=configs/from_run.py:{old_run}",
      f"--workdir={old_run}",
      "--config.train.steps=2",
      *QUIET,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  recs = read_metrics(old_run)
  assert [r["step"] for r in recs] == [1, 2] and recs[1]["actor/kl_ref"] >= 0  # resumed at step 2
