"""rl/checkpoints.open_for_evaluation, the one door scripts open a saved run through: it restores the
checkpoint through `restore` (a LoRA checkpoint only onto the base it was trained on), refuses a run
whose task changed unless told, names a missing run or step; and experiments/evaluate.py on it
scores the dev split or the locked test split, its rows picked by --seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from agentfly_jax.rl import checkpoints
from agentfly_jax.rl.config import task_config
from agentfly_jax.rl.run import open_run
from agentfly_jax.rl.run_log import write_run_record
from agentfly_jax.rl.spec import RunSpec
from train_cli import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.fast_compile]


def _config(**overrides):
  c = task_config(
    "lookup",
    "grpo",
    **{
      "model.hidden_size": 32,
      "model.num_layers": 1,
      "model.num_heads": 2,
      "model.num_kv_heads": 1,
      "model.head_dim": 16,
      "model.intermediate_size": 64,
      "model.vocab_size": 512,
      "rollout.max_turns": 2,
      "rollout.max_tokens_per_turn": 8,
      "rollout.max_total_tokens": 512,
      "sft.steps": 0,
      **overrides,
    },
  )
  c.log.progress = c.log.tensorboard = False
  return c


def _saved_run(workdir, config, step: int, seed: int):
  """A run record and checkpoint `step` of params moved off their init by fresh random noise."""
  run = open_run(RunSpec.from_config(config), str(workdir))
  write_run_record(run)
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda x: x + rng.normal(0, 0.1, x.shape).astype(x.dtype), run.parts.policy.params)
  state = run.states.new(params)
  checkpoints.save(run, step, state, data_position=5)
  run.checkpointer.wait()
  return jax.tree.map(np.asarray, state.params)


def _same(a, b) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_open_restores_the_checkpoint_and_names_what_is_wrong(tmp_path):
  workdir = tmp_path / "run"
  saved = _saved_run(workdir, _config(), step=3, seed=1)
  opened = checkpoints.open_for_evaluation(str(workdir))
  assert opened.step == 3 and opened.task_changed is None
  assert _same(jax.tree.map(np.asarray, opened.state.params), saved)
  with pytest.raises(FileNotFoundError, match="step 7"):
    checkpoints.open_for_evaluation(str(workdir), 7)
  with pytest.raises(FileNotFoundError, match="config.json"):
    checkpoints.open_for_evaluation(str(tmp_path / "nothing"))
  record = json.loads((workdir / "task.json").read_text())
  (workdir / "task.json").write_text(json.dumps({**record, "fingerprint": "0" * 16}))
  with pytest.raises(ValueError, match="differs from what its config.json rebuilds"):
    checkpoints.open_for_evaluation(str(workdir))
  assert "differs" in checkpoints.open_for_evaluation(str(workdir), allow_changed_task=True).task_changed


def test_a_lora_checkpoint_opens_only_onto_its_own_base(tmp_path):
  workdir = tmp_path / "lora"
  _saved_run(workdir, _config(**{"model.lora.rank": 2, "model.lora.alpha": 4.0}), step=1, seed=2)
  assert checkpoints.open_for_evaluation(str(workdir)).step == 1
  saved = json.loads((workdir / "config.json").read_text())
  (workdir / "config.json").write_text(json.dumps({**saved, "seed": saved["seed"] + 1}))  # another random base
  with pytest.raises(ValueError, match="LoRA adapters were trained on the base"):
    checkpoints.open_for_evaluation(str(workdir), allow_changed_task=True)


def test_evaluate_script_scores_dev_and_the_locked_test_split(tmp_path):
  from agentfly_jax.tasks import get_task, task_spec

  workdir = tmp_path / "run"
  _saved_run(workdir, _config(), step=2, seed=3)
  lookup = task_spec(get_task("lookup"))

  def evaluate(*flags):
    cmd = [
      sys.executable,
      os.path.join(ROOT, "experiments", "evaluate.py"),
      f"--workdir={workdir}",
      "--num_rows=2",
      "--transcript_chains=2",
      *flags,
    ]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]

  evaluate("--split=test", "--seed=11")
  evaluate("--split=dev", "--seed=12")
  test = json.loads((workdir / "eval_test_step2.json").read_text())
  assert test["split"] == "test" and test["seed"] == 11 and test["eval/num_chains"] == 2
  transcript = (workdir / "eval_test_step2_transcript.txt").read_text()
  for row in lookup.make_test_rows(2, seed=11):
    assert row["question"] in transcript
  dev_transcript = (workdir / "eval_step2_transcript.txt").read_text()
  for row in lookup.make_eval_rows(2, seed=12):
    assert row["question"] in dev_transcript
