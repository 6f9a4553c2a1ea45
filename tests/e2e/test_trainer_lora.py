"""LoRA GRPO through experiments/train.py (the tiny lookup policy): 2 steps on the JAX sampler
(its multi-turn prefix cache on), checkpoints of adapters + the base's identity, adapter-only
syncs, and a run resumed from its step-1 checkpoint that continues exactly like the uninterrupted one."""

import json
import os
import shutil

import numpy as np
import pytest
from train_cli import run_train

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

LORA = [
  "--config.model.lora.rank=4",
  "--config.model.lora.alpha=8.0",
  "--config.loss.kl_coef=0.01",
  "--config.loss.entropy_coef=0.05",  # a gradient even when every chain of a group scores the same
  "--config.rollout.rows_per_step=2",
  "--config.rollout.num_chains=4",
  "--config.rollout.max_turns=2",
  "--config.rollout.max_tokens_per_turn=16",
  "--config.train.micro_batch_size=8",
  "--config.train.lr=0.001",
  "--config.checkpoint.every=1",
  "--config.log.tensorboard=False",
]
INVARIANT = ["--config.rollout.batch_invariant=True"]  # the JAX engine: a resumed run repeats the tokens


def _no_times(records):
  """The records without wall-clock times and the JAX engine's timing-dependent counters (queue waits, tok/s)."""
  return {r["step"]: {k: v for k, v in r.items() if not k.startswith(("time/", "sampler/"))} for r in records}


def _checkpoint_arrays(step_dir):
  """{param path: shape} of a checkpoint's TrainState params (from orbax's metadata)."""
  with open(os.path.join(step_dir, "state", "_METADATA")) as f:
    meta = json.load(f)
  return {k: v for k, v in meta["tree_metadata"].items() if k.startswith("('params'")}


@pytest.mark.slow
def test_lora_grpo_jax_sampler_checkpoints_and_resume(tmp_path):
  full = run_train(tmp_path / "full", "--config.train.steps=2", *LORA, *INVARIANT)
  assert [r["step"] for r in full] == [1, 2]
  for r in full:
    assert np.isfinite(r["actor/pg_loss"]) and np.isfinite(r["actor/kl_ref"])
    assert r["actor/grad_norm"] > 0
    # the JAX engine's counters reach the metrics (a chain's second turn reuses its first turn's pages), and
    # with the adapters synced the sampler's log-probs stay the trainer's
    assert r["sampler/decode_tokens"] > 0 and r["sampler/prefix_hit_tokens"] > 0 and r["sampler/preemptions"] == 0
    assert r["mismatch/max_abs_diff"] < 1e-3, r
  # tiny lookup policy: 2 layers x 7 projections x (A, B), rank 4 -> the adapters' bytes
  with open(tmp_path / "full" / "config.json") as f:
    cfg = json.load(f)
  warm = cfg["model"]["pretrained"]
  with open(os.path.join(warm, "config.json")) as f:
    hf = json.load(f)
  d, i, layers = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
  hd = hf.get("head_dim") or d // hf["num_attention_heads"]
  q, kv = hf["num_attention_heads"] * hd, hf["num_key_value_heads"] * hd
  ins_outs = [(d, q), (d, kv), (d, kv), (q, d), (d, i), (d, i), (i, d)]
  adapter_bytes = 4 * 4 * layers * sum(a + b for a, b in ins_outs)
  assert full[-1]["sync/bytes"] == adapter_bytes
  # checkpoints hold the adapters (+ their Adam moments), not the base; meta names the base
  step_dir = tmp_path / "full" / "checkpoints" / "2"
  params = _checkpoint_arrays(step_dir)
  assert params and all("lora_a" in k or "lora_b" in k for k in params), list(params)[:4]
  assert len(params) == 2 * 7 * layers
  with open(step_dir / "meta" / "metadata") as f:
    meta = json.load(f)
  assert meta["lora_base"]["source"] == os.path.abspath(warm) and len(meta["lora_base"]["sha256"]) == 64

  # resume: the run's workdir as it stood after step 1 (its step-2 checkpoint gone), a new process to step 2 ==
  # the uninterrupted run; resuming drops the metrics records past the restored step
  part = tmp_path / "part"
  shutil.copytree(tmp_path / "full", part)
  shutil.rmtree(part / "checkpoints" / "2")
  resumed = run_train(part, "--config.train.steps=2", *LORA, *INVARIANT)
  assert [r["step"] for r in resumed] == [1, 2] and resumed[0] == full[0]
  # the batch-invariant engine: the same tokens and sampler log-probs whatever rows shared a decode batch
  record, got = _no_times(full)[2], _no_times(resumed)[2]
  assert set(got) == set(record)
  for k, v in record.items():
    assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


@pytest.mark.slow
@pytest.mark.vllm
def test_lora_grpo_vllm_sampler_loads_adapters_as_lora_requests(tmp_path):
  recs = run_train(
    tmp_path / "run",
    "--config.rollout.sampler=vllm",
    "--config.train.steps=2",
    *LORA,
    "--config.train.lr=0.02",
    "--config.model.lora.alpha=16.0",
  )
  assert [r["step"] for r in recs] == [1, 2]
  assert recs[0]["actor/update_norm"] > 0
  for r in recs:
    assert r["mismatch/num_tokens"] > 0
    # step 2 samples from the adapters step 1 trained: a stale engine would be far off
    assert r["mismatch/max_abs_diff"] < 1e-3, r
  assert 0 < recs[-1]["sync/bytes"] < 200_000  # adapters only (the tiny base is ~2 MB)
