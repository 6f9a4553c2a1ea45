"""configs/visual_qa_grpo.py end to end: a tiny random-init Qwen2.5-VL policy, its tiny tokenizer with the vision
tokens, the env server's images in the opening message, the paged engine sampling with them and the train step
recomputing the same log-probs from the same pixels (ratio 1, zero KL: an engine that dropped the images, or
a trainer that read others, would not match), the trained weights pushed back with the frozen tower kept."""

from __future__ import annotations

import os
import subprocess

import pytest

from train_cli import ROOT, read_metrics, train_command


def _two_steps(tmp_path, *overrides: str) -> list[dict]:
  """Two GRPO steps of the tiny visual_qa run (after `overrides`); the records with a rollout."""
  env = dict(os.environ, AGENTFLY_LOCAL_ENVS="visual_qa=2:0")
  env.pop("AGENTFLY_ENV_SERVERS", None)
  out = subprocess.run(
    train_command(
      tmp_path,
      "--config.train.steps=2",
      "--config.rollout.rows_per_step=1",
      "--config.rollout.num_chains=2",
      "--config.rollout.max_tokens_per_turn=16",
      "--config.model.intermediate_size=128",
      "--config.model.num_layers=1",
      "--config.model.vision.max_pixels=4096",
      "--config.checkpoint.every=100",
      "--config.eval.num_rows=0",
      *overrides,
      config="configs/visual_qa_grpo.py",
    ),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
    env=env,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  records = [r for r in read_metrics(tmp_path) if "rollout/reward_mean" in r]
  assert [r["step"] for r in records] == [1, 2]
  return records


@pytest.mark.slow
def test_two_grpo_steps_over_images(tmp_path):
  """After an SFT warm start on image chains (task visual_qa_colors: demos that answer from their row, the SFT
  step reading each row's pixels)."""
  records = _two_steps(
    tmp_path, "--config.task=visual_qa_colors", "--config.sft.steps=2", "--config.sft.rows_per_step=2"
  )
  start = next(r for r in read_metrics(tmp_path) if r["step"] == 0)
  assert start["sft/nll_last"] < start["sft/nll_first"], start
  for r in records:
    assert r.get("rollout/finish/error", 0.0) == 0.0 and r["env/visual_qa/crashes"] == 0
    assert r["actor/n_tokens"] > 0
    assert abs(r["actor/ratio_mean"] - 1.0) < 1e-3 and abs(r["actor/ppo_kl"]) < 1e-4, r


@pytest.mark.slow
@pytest.mark.vllm
def test_two_grpo_steps_over_images_sampled_by_vllm(tmp_path):
  """rollout.sampler=vllm: vLLM serves the VL policy with the chains' images (its log-probs equal the train step's
  recompute from the same pixels; images dropped or read twice would not), step 2 after the first weight sync."""
  pytest.importorskip("vllm")
  for r in _two_steps(tmp_path, "--config.rollout.sampler=vllm"):
    assert r.get("rollout/finish/error", 0.0) == 0.0 and r["actor/n_tokens"] > 0
    assert r["mismatch/max_abs_diff"] < 1e-4, r
