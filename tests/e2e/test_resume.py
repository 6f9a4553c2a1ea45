"""Killing training with SIGKILL while a checkpoint is being written, then resuming, starts from
the last complete checkpoint and gives the same metrics for the following steps as an
uninterrupted run (same seed, CPU): orbax writes a step into `<step>.orbax-checkpoint-tmp` and
renames it when complete.

The same runs show the SFT warm start's step-0 record through experiments/train.py: the
uninterrupted run has `eval.before_sft` on (the base model's greedy eval first, eval_pre_sft/*,
then the SFT's NLL and time and the eval after it, eval/*), the killed one has it off (no pre-SFT
eval, the rest as before); the pre-SFT eval changes nothing of training, so their steps still
match."""

import os
import signal
import subprocess
import time

import pytest
from train_cli import ROOT, read_metrics, train_command

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

FLAGS = [
  "--config.sft.steps=2",
  "--config.sft.rows_per_step=4",
  "--config.train.steps=4",
  "--config.rollout.rows_per_step=2",
  "--config.rollout.num_chains=4",
  "--config.rollout.max_tokens_per_turn=16",
  "--config.rollout.max_turns=2",
  "--config.loss.entropy_coef=0.05",
  "--config.train.lr=0.001",
  "--config.train.micro_batch_size=8",
  "--config.checkpoint.every=1",
  "--config.log.tensorboard=False",
  "--config.eval.every=100",  # step 0 only
  "--config.eval.num_rows=4",
  "--config.rollout.batch_invariant=True",  # the same tokens whatever rows shared the engine's batches
]


def _cmd(workdir, before_sft: bool):
  return train_command(workdir, *FLAGS, f"--config.eval.before_sft={before_sft}")


def _assert_sft_step_zero(record, before_sft: bool):
  """Step 0's record: the pre-SFT eval only when asked; the SFT ran (its NLL and time), then the eval after it."""
  pre_sft = [k for k in record if k.startswith("eval_pre_sft/")]
  assert bool(pre_sft) == before_sft, sorted(record)
  if before_sft:
    assert record["eval_pre_sft/num_chains"] == 4
  assert record["eval/num_chains"] == 4 and record["time/sft_s"] > 0
  assert 0 < record["sft/nll_first"] < 20 and 0 < record["sft/nll_last"] < 20  # trained: its NLL is recorded


def _kill_while_a_checkpoint_is_written(proc, ckpt, first_step: int) -> int:
  """SIGKILLs `proc` while orbax writes a checkpoint of step >= first_step; returns that step.

  On seeing a temporary checkpoint directory it freezes the process (SIGSTOP stops orbax's
  writer threads too), checks the directory is still temporary, and kills; if the write finished
  in between, it lets the run go on and waits for the next checkpoint.
  """
  deadline = time.time() + 900
  while time.time() < deadline:
    if proc.poll() is not None:
      pytest.fail("training ended before it could be killed during a checkpoint write")
    names = os.listdir(ckpt) if ckpt.is_dir() else []
    writing = [int(n.split(".")[0]) for n in names if n.endswith(".orbax-checkpoint-tmp")]
    writing = [step for step in writing if step >= first_step]
    if writing:
      os.kill(proc.pid, signal.SIGSTOP)
      if (ckpt / f"{writing[0]}.orbax-checkpoint-tmp").is_dir():
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return writing[0]
      os.kill(proc.pid, signal.SIGCONT)
      first_step = writing[0] + 1
    time.sleep(0.002)
  pytest.fail("no checkpoint write was caught")


def _metrics(workdir):
  # time/* and the JAX engine's counters (queue waits, tok/s, which rows shared a decode batch) are timing
  return {
    r["step"]: {k: v for k, v in r.items() if not k.startswith(("time/", "sampler/"))} for r in read_metrics(workdir)
  }


@pytest.mark.slow
def test_sigkill_and_resume_matches_uninterrupted(tmp_path):
  full = tmp_path / "full"
  subprocess.run(_cmd(full, before_sft=True), cwd=ROOT, check=True, capture_output=True, timeout=900)
  _assert_sft_step_zero(read_metrics(full)[0], before_sft=True)
  expected = _metrics(full)
  assert sorted(expected) == [0, 1, 2, 3, 4]

  killed = tmp_path / "killed"
  proc = subprocess.Popen(
    _cmd(killed, before_sft=False), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  writing = _kill_while_a_checkpoint_is_written(proc, killed / "checkpoints", first_step=2)
  ckpt = killed / "checkpoints"
  steps_done = sorted(int(p) for p in os.listdir(ckpt) if p.isdigit())
  # The step being written is not there (only its temporary directory); the one before it is.
  assert (ckpt / f"{writing}.orbax-checkpoint-tmp").is_dir() and writing not in steps_done
  assert max(steps_done) == writing - 1 >= 1, steps_done

  resumed_from = max(steps_done)  # the last complete checkpoint
  kept = [r for r in read_metrics(killed) if r["step"] <= resumed_from]
  subprocess.run(_cmd(killed, before_sft=False), cwd=ROOT, check=True, capture_output=True, timeout=900)
  got = _metrics(killed)
  assert sorted(got) == [0, 1, 2, 3, 4]
  # It resumed there: the records up to that step (wall times included) are the killed run's.
  assert [r for r in read_metrics(killed) if r["step"] <= resumed_from] == kept
  assert [r["step"] for r in kept] == list(range(resumed_from + 1))
  _assert_sft_step_zero(kept[0], before_sft=False)
  for step in range(resumed_from + 1, 5):
    assert set(got[step]) == set(expected[step])
    for key, value in expected[step].items():
      assert got[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
  # the run did learn something (otherwise equality would be trivial)
  assert expected[4]["actor/grad_norm"] > 0
