"""One tiny run through experiments/train.py flags serves every check that only reads a run: a
user's task (JSON rows + a module with a custom tool and reward, configs/custom_grpo.py), DAPO
knobs on (overlong penalty, clip-higher; dynamic sampling is unit-tested in
tests/rl/test_rl_batching.py), a KL penalty to the step-0 reference, W&B offline beside the JSONL
writer. On it: the user's reward ran; experiments/evaluate.py rebuilds the custom task from the
saved config.json (from another directory, read only) and refuses a run whose task content differs;
its sampled multi-chain evaluation gives pass@k; the W&B run holds every metrics.jsonl step; and a
resume past the last step restores the KL reference from its own checkpoint. The tests run in file
order (the last one extends the run)."""

import json
import os
import re
import subprocess
import sys

import pytest
from custom_task_testlib import WORDS, env_with, task_flags, write_task
from train_cli import ROOT, read_metrics, train_command

pytestmark = [pytest.mark.slow, pytest.mark.fast_compile]

DAPO_KL = ("--config.dapo.overlong_buffer=8", "--config.loss.clip_high=0.28", "--config.loss.kl_coef=0.01")


def _train(tmp_path, folder, workdir, steps: int):
  cmd = train_command(
    workdir,
    *task_flags(folder),
    f"--config.train.steps={steps}",
    "--config.rollout.rows_per_step=2",
    "--config.rollout.num_chains=2",
    "--config.rollout.max_turns=2",
    "--wandb",
    "--config.log.tensorboard=False",
    *DAPO_KL,
    config="configs/custom_grpo.py",
  )
  env = {**env_with(folder), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]


def _evaluate(folder, workdir, cwd, *flags):
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", "evaluate.py"), f"--workdir={workdir}", *flags],
    cwd=cwd,
    env=env_with(folder),
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.fixture(scope="module")
def golden_run(tmp_path_factory):
  """(tmp_path, task folder, workdir, evaluation) of the run, trained 2 steps, then evaluated once by
  experiments/evaluate.py from another directory: 4 rows x 2 sampled chains, every chain in the
  transcript. `evaluation`: its process result and the run's config.json bytes and mtime before it."""
  tmp_path = tmp_path_factory.mktemp("golden_run")
  folder = tmp_path / "user"
  write_task(folder)
  workdir = tmp_path / "run"
  _train(tmp_path, folder, workdir, steps=2)
  config_bytes, config_mtime = (workdir / "config.json").read_bytes(), (workdir / "config.json").stat().st_mtime_ns
  flags = ("--num_rows=4", "--num_chains=2", "--temperature=1.0", "--transcript_chains=8")
  ev = _evaluate(folder, workdir, tmp_path, *flags)
  return tmp_path, folder, workdir, (ev, config_bytes, config_mtime)


def test_custom_task_trains_and_evaluates_from_flags(golden_run):
  tmp_path, folder, workdir, (ev, config_bytes, config_mtime) = golden_run
  recs = read_metrics(workdir)
  assert [r["step"] for r in recs] == [1, 2]
  assert all(r["rollout/reward_metric/mirror_reward_ran"] == 1.0 for r in recs)  # the user's reward ran
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["task"]["module"] == "mirror_task" and os.path.isabs(saved["task"]["train_path"])

  # evaluate.py from another directory: it rebuilds the custom task from the saved config.json
  assert ev.returncode == 0, ev.stderr[-4000:]
  # read only: the run's config.json is neither rewritten nor touched
  assert (workdir / "config.json").read_bytes() == config_bytes
  assert (workdir / "config.json").stat().st_mtime_ns == config_mtime
  result = json.loads((workdir / "eval_step2.json").read_text())
  assert result["eval/num_chains"] == 8 and result["eval/reward_metric/mirror_reward_ran"] == 1.0
  transcript = (workdir / "eval_step2_transcript.txt").read_text()
  # every chain, the eval rows (eval.jsonl: the first 4 words), the custom tool's schema and the system prompt
  assert len(re.findall(r"^group \d+ chain \d+ \|", transcript, re.MULTILINE)) == 8 and "⟦" in transcript
  for w in WORDS[:4]:
    assert f"Spell {w} backwards." in transcript
  assert "mirror_word" in transcript and "Spell words backwards with the mirror tool." in transcript
  prompts = re.sub("⟦.*?⟧", "", transcript, flags=re.DOTALL)  # what the run gave the model (its sampled text aside)
  assert "lookup" not in prompts  # not the built-in demo task

  # a run whose recorded task content differs from what its config rebuilds (e.g. a Task given in
  # Python) is refused by name instead of silently evaluating another task
  task_json_text = (workdir / "task.json").read_text()
  task_json = json.loads(task_json_text)
  assert task_json["name"] == "custom" and len(task_json["fingerprint"]) == 16
  (workdir / "task.json").write_text(json.dumps({**task_json, "fingerprint": "0" * 16}))
  try:
    ev = _evaluate(folder, workdir, tmp_path, "--num_rows=3")
    assert ev.returncode != 0 and "differs from what its config.json rebuilds" in ev.stderr, ev.stderr[-2000:]
  finally:
    (workdir / "task.json").write_text(task_json_text)


def test_wandb_offline_run_holds_the_metrics_jsonl_steps(golden_run):
  """The W&B writer, run for real (WANDB_MODE=offline): the run's record log holds every
  per-step metric of metrics.jsonl, same step, same value."""
  from wandb_offline import offline_history

  tmp_path, _, workdir, _ = golden_run
  history = {row["_step"]: row for row in offline_history(str(tmp_path))}
  recs = read_metrics(workdir)
  assert sorted(history) == [r["step"] for r in recs]
  for r in recs:
    logged = history[r["step"]]
    for key, value in r.items():
      if key == "step":
        continue
      assert key in logged, key
      assert logged[key] == (pytest.approx(value) if isinstance(value, (int, float)) else value), key
  assert "rollout/reward_mean" in history[1] and "rollout/turns_mean" in history[2]


def test_dapo_run_then_evaluate(golden_run):
  """DAPO + KL metrics on every step, the policy equal to its reference at step 1; the sampled
  multi-chain evaluation of the checkpoint; a resume past it restores the KL reference (kl > 0)."""
  tmp_path, folder, workdir, (ev, _, _) = golden_run
  recs = read_metrics(workdir)
  assert all("dapo/overlong_penalty_mean" in r and "actor/kl_ref" in r for r in recs)
  assert recs[0]["actor/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
  assert ev.returncode == 0, ev.stderr[-3000:]
  result = json.loads((workdir / "eval_step2.json").read_text())
  assert result["step"] == 2 and 0.0 <= result["eval/success_rate"] <= 1.0
  assert "eval/pass@2" in result and result["eval/num_chains"] == 8
  _train(tmp_path, folder, workdir, steps=3)  # resumes from step 2
  recs = read_metrics(workdir)
  assert [r["step"] for r in recs] == [1, 2, 3] and recs[2]["actor/kl_ref"] > 0
