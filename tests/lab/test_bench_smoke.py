"""Every lab/bench script runs at a smoke size (tiny models, one round, a few requests) as a child
process, so none rots: it parses its flags, imports what the library has today, measures and writes
its JSON + table. The numbers are not checked (a benchmark's result is its table, not a test); that
the script ran to the end and wrote its results is. Helpers (imported by the scripts, not run) are
listed in HELPERS; a new script without a smoke row fails test_every_bench_script_has_a_smoke_row.
lab/report_sft_rl_run.py re-renders a committed record."""

import os
import subprocess
import sys

import pytest
from train_cli import ROOT

BENCH = os.path.join(ROOT, "lab", "bench")
HELPERS = {"bench_common.py", "bench_machine.py", "bench_train_step_report.py", "torch_reference_step.py"}

# script -> (flags at smoke size, with {tmp} the test's folder; the files it must write; marks)
SMOKE = {
  "bench_partial.py": (
    "--steps=2 --repeats=1 --rows=2 --chains=2 --long_turns=3 --batch_s=0.001 --row_s=0 --update_s=0.01"
    " --partial_staleness=1 --engine_steps=0 --out={tmp}/bench_partial",
    ["bench_partial.json", "bench_partial.md"],
    (),
  ),
  "bench_judge.py": (
    "--rounds=1 --rows=2 --chains=2 --latency_s=0.01 --out={tmp}/bench_judge",
    ["bench_judge.json"],
    (),
  ),
  # two short demo runs (the static sampler and the engine): train.py's start-up and compiles dominate
  "bench_demo_sampler.py": (
    "--steps=2 --repeats=1 --out={tmp}/bench_demo_sampler",
    ["bench_demo_sampler.json", "bench_demo_sampler.md"],
    ("slow",),
  ),
  "bench_retrieval.py": ("--scale=0.01 --queries=10 --out={tmp}/bench_retrieval", ["bench_retrieval.json"], ()),
  "bench_envservers.py": (
    "--num_noop_calls=20 --num_chains=8 --io_call_s=0.01 --io_rounds=1 --num_sandbox_calls=3"
    " --num_sandbox_starts=1 --out_dir={tmp}",
    ["bench_envservers.json", "bench_envservers.md"],
    (),
  ),
  # 6 s of episodes, the pool sampled every 0.1 s, so its in_use is seen at the cap on a loaded machine too
  "bench_envserver_load.py": (
    "--num_chains=32 --cap=2 --duration_s=6 --sample_s=0.1 --out_dir={tmp}",
    ["bench_envserver_load.json", "bench_envserver_load.md"],
    (),
  ),
  "bench_envservers_worlds.py": (
    "--worlds=webshop --num_steps=5 --num_resets=1 --out_dir={tmp}",
    ["bench_envservers_worlds.json", "bench_envservers_worlds.md"],
    (),
  ),
  "bench_swe.py": (
    "--episodes=1 --concurrent=2 --tasks=1 --cold_starts=1 --out={tmp}/bench_swe",
    ["bench_swe.json", "bench_swe.md"],
    (),
  ),
  # JAX: tiny models or one SmolLM2-shaped layer, one timed round
  "bench_scan_layers.py": (
    "--depths= --step_depth=1 --vocab_size=512 --shape=1x16 --repeats=1 --out={tmp}/bench_scan_layers",
    ["bench_scan_layers.json", "bench_scan_layers.md"],
    (),
  ),
  "bench_memory.py": (
    "--sizes=d256_L4_v8k --remat=none --meshes=1x1 --micro_batch=1 --seq_len=32 --out={tmp}/bench_memory",
    ["bench_memory.json", "bench_memory.md"],
    (),
  ),
  "bench_prefix_cache.py": (
    "--layers=1 --vocab_size=512 --chains=2 --turns=2 --system=8 --task=4 --reply=4 --obs=4 --repeats=1"
    " --out={tmp}/bench_prefix_cache",
    ["bench_prefix_cache.json", "bench_prefix_cache.md"],
    (),
  ),
  "bench_lora.py": (
    "--num_layers=1 --vocab_size=512 --batch=2 --seq=16 --micro_batch=1 --steps=1 --rank=2 --decode_batch=1"
    " --decode_tokens=2"
    " --out={tmp}/bench_lora",
    ["bench_lora.json", "bench_lora.md"],
    (),
  ),
  # a distillation run of tiny qwen2 models over the demo's tokenizer: the student's prepare and two teachers
  "bench_teacher_forward.py": (
    "--model=tiny --num_layers=1 --shape=2x16 --warmup=0 --repeats=1 --out={tmp}/bench_teacher_forward"
    " --work_dir={tmp}/work",
    ["bench_teacher_forward.json", "bench_teacher_forward.md"],
    (),
  ),
  # the PyTorch + transformers reference worker (torch_reference_step.py) runs beside the JAX one
  "bench_train_step.py": (
    "--models=tiny --shapes=2x32 --frameworks=jax,torch --steps=policy --repeats=1 --matmul_n=256"
    " --out={tmp}/bench_train_step --work_dir={tmp}/work",
    ["bench_train_step.json", "bench_train_step.md"],
    (),
  ),
  "profile_train_step.py": (
    "--models=tiny --shapes=2x32 --frameworks=jax --steps=policy --repeats=1 --top=3 --top_gemms=1"
    " --profile_out={tmp}/profile_train_step --work_dir={tmp}/work",
    ["profile_train_step.json", "profile_train_step.md"],
    (),
  ),
  "bench_moe_train_step.py": (
    "--shapes=2x16 --models=moe,dense_active --repeats=1 --num_layers=1 --hidden_size=32 --num_heads=2"
    " --num_kv_heads=1 --head_dim=16 --vocab_size=128 --num_experts=4 --moe_intermediate_size=16"
    " --out={tmp}/bench_moe_train_step",
    ["bench_moe_train_step.json", "bench_moe_train_step.md"],
    (),
  ),
  "bench_vl_train_step.py": (
    "--rows=2 --image_px=16 --text_tokens=24 --num_layers=1 --repeats=1 --out={tmp}/bench_vl_train_step",
    ["bench_vl_train_step.json", "bench_vl_train_step.md"],
    ("slow",),
  ),
  "bench_sampler.py": (
    "--engines=jax,hf --models=tiny --batch_sizes=1 --prompt_len=4 --new_tokens=4 --repeats=1 --sync_repeats=1"
    " --pause_s=0 --floor_copy_mib=16 --floor_matmul_n=256 --floor_reps=1 --gemm_reps=1 --out_dir={tmp}"
    " --work_dir={tmp}/work",
    ["bench_sampler.json", "bench_sampler.md"],
    (),
  ),
  "bench_endpoint.py": (
    "--reps=1 --requests=5 --rows=1 --chains=2 --out={tmp}/bench_endpoint",
    ["bench_endpoint.json", "bench_endpoint.md"],
    (),
  ),
  "bench_rollout_engine.py": (
    "--models=tiny --engines=jax --chains=2 --turns=1 --nogrpo --rounds=1 --max_len=256"
    " --out={tmp}/bench_rollout_engine",
    ["bench_rollout_engine.json", "bench_rollout_engine.md"],
    (),
  ),
  # the demo's tiny warm-start policy (its tokenizer and chat template) in place of SmolLM2-135M's 30 layers
  "measure_tool_formats.py": (
    "--num_rows=1 --sampled_chains=0 --max_tokens_per_turn=8 --formats=hermes"
    " --model_dir=experiments/results/lookup_warmstart --out={tmp}/smollm2_tool_formats",
    ["smollm2_tool_formats.json", "smollm2_tool_formats.md"],
    (),
  ),
  # whole train.py runs of the demo (their programs are the e2e tests', in the test run's compile cache)
  "bench_chains.py": (
    "--chains=8 --num_chains=4 --steps=2 --workdir={tmp}/runs --out={tmp}/bench_chains",
    ["bench_chains.json", "bench_chains.md"],
    ("slow",),
  ),
  "bench_async.py": (
    "--steps=1 --eval_rows=2 --workdir={tmp}/runs --out={tmp}/bench_async",
    ["bench_async.json", "bench_async.md"],
    ("slow",),
  ),
  "bench_vllm_async.py": (
    "--layers=1 --rounds=1 --chains=2 --turns=1 --long_tokens=4 --short_tokens=2 --latency_long_tokens=8"
    " --out={tmp}/bench_vllm_async",
    ["bench_vllm_async.json", "bench_vllm_async.md"],
    ("slow", "vllm"),
  ),
}

# Rows whose child processes compile more than they run (tiny programs run once or twice; whole train.py
# runs of the demo, most of whose CPU time goes to the first step's compiles): XLA:CPU's LLVM backend at
# -O0 there. Each row's CPU seconds were taken at the default level and at -O0 and the row is listed where
# -O0 took less (bench_demo_sampler and bench_async: as the demo's train.py run they each start twice);
# the other rows keep the default level.
O0_ROWS = {
  "bench_lora.py",
  "bench_memory.py",
  "bench_prefix_cache.py",
  "bench_rollout_engine.py",
  "bench_sampler.py",
  "bench_scan_layers.py",
  "bench_teacher_forward.py",
  "bench_train_step.py",
  "bench_moe_train_step.py",
  "bench_vl_train_step.py",
  "measure_tool_formats.py",
  "profile_train_step.py",
  "bench_chains.py",
  "bench_demo_sampler.py",
  "bench_async.py",
}


def test_every_bench_script_has_a_smoke_row():
  scripts = {f for f in os.listdir(BENCH) if f.endswith(".py")}
  assert scripts - HELPERS - set(SMOKE) == set(), "lab/bench scripts without a smoke row"
  assert set(SMOKE) | HELPERS <= scripts, "smoke rows / helpers of scripts that no longer exist"


def _params():
  for script, (_, _, marks) in SMOKE.items():
    yield pytest.param(script, id=script.removesuffix(".py"), marks=[getattr(pytest.mark, m) for m in marks])


@pytest.mark.parametrize("script", _params())
def test_bench_script_runs_at_smoke_size(script, tmp_path):
  args, outputs, _ = SMOKE[script]
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  if script in O0_ROWS:  # JAX's switch, as the fast_compile test files use: their train.py programs are shared
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
  cmd = [sys.executable, os.path.join(BENCH, script), *args.format(tmp=tmp_path).split()]
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
  missing = [name for name in outputs if not os.path.exists(os.path.join(tmp_path, name))]
  assert not missing, f"{script} did not write {missing}"


def test_report_sft_rl_run_renders_a_committed_record(tmp_path):
  """lab/report_sft_rl_run.py on lab/results/smollm2_arithmetic (its metrics.jsonl and config.json):
  the curve and a README naming the run's steps and headline metric."""
  record = os.path.join(ROOT, "lab", "results", "smollm2_arithmetic")
  cmd = [sys.executable, os.path.join(ROOT, "lab", "report_sft_rl_run.py"), f"--workdir={record}", f"--out={tmp_path}"]
  proc = subprocess.run(
    cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (tmp_path / "curve.png").stat().st_size > 0
  readme = (tmp_path / "README.md").read_text()
  assert "success" in readme and "metrics.jsonl" in readme
