"""Killing training with SIGKILL and resuming gives the same metrics for the following steps as
an uninterrupted run (same seed, CPU)."""
import os
import signal
import subprocess
import time

import pytest
from train_cli import ROOT, read_metrics, train_command

FLAGS = ["--config.sft.steps=2", "--config.sft.rows_per_step=4",
         "--config.train.steps=4", "--config.rollout.rows_per_step=2", "--config.rollout.num_chains=4",
         "--config.rollout.max_tokens_per_turn=16", "--config.rollout.max_turns=2",
         "--config.loss.entropy_coef=0.05", "--config.train.lr=0.001", "--config.train.micro_batch_size=8",
         "--config.checkpoint.every=1", "--config.log.tensorboard=False"]


def _cmd(workdir):
  return train_command(workdir, *FLAGS)


def _metrics(workdir):
  return {r["step"]: {k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(workdir)}


@pytest.mark.slow
def test_sigkill_and_resume_matches_uninterrupted(tmp_path):
  full = tmp_path / "full"
  subprocess.run(_cmd(full), cwd=ROOT, check=True, capture_output=True, timeout=900)
  expected = _metrics(full)
  assert sorted(expected) == [1, 2, 3, 4]

  killed = tmp_path / "killed"
  proc = subprocess.Popen(_cmd(killed), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  ckpt = killed / "checkpoints"
  deadline = time.time() + 900
  while time.time() < deadline and not (ckpt / "2").is_dir():
    if proc.poll() is not None:
      pytest.fail("training ended before it could be killed")
    time.sleep(0.2)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  steps_done = sorted(int(p) for p in os.listdir(ckpt) if p.isdigit())
  assert 2 in steps_done and max(steps_done) < 4, steps_done

  subprocess.run(_cmd(killed), cwd=ROOT, check=True, capture_output=True, timeout=900)
  got = _metrics(killed)
  assert sorted(got) == [1, 2, 3, 4]
  resumed_from = max(steps_done)
  for step in range(resumed_from + 1, 5):
    assert set(got[step]) == set(expected[step])
    for key, value in expected[step].items():
      assert got[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
  # the run did learn something (otherwise equality would be trivial)
  assert expected[4]["actor/grad_norm"] > 0
