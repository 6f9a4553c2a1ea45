"""experiments/aot_compile.py: a run's programs compiled for a TPU topology on this CPU (jax[tpu]'s
libtpu compiles, nothing runs); bad input stops before compiling with a message naming it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from train_cli import AOT_TINY_FLAGS, ROOT  # noqa: E402

from agentfly_jax.rl.spec import RunSpec

SCRIPT = os.path.join(ROOT, "experiments", "aot_compile.py")
TINY = AOT_TINY_FLAGS

pytest.importorskip("libtpu", reason="jax[tpu] (libtpu) is needed for TPU compile-only")


def aot(*args, timeout=1500):
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("JAX_PLATFORMS", None)  # the TPU plugin must load (it finds no TPU and compiles only)
  return subprocess.run(
    [sys.executable, SCRIPT, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT
  )


def lookup_config(**mesh):
  import importlib.util

  spec = importlib.util.spec_from_file_location("lookup_grpo", os.path.join(ROOT, "configs", "lookup_grpo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config()
  config.mesh.update(mesh)
  return config


def test_malformed_topology_exits_1_before_compiling():
  proc = aot("--config=configs/lookup_grpo.py", "--topology=v5litepod-8", timeout=300)
  assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert "--topology='v5litepod-8' is unknown or malformed" in proc.stderr, proc.stderr[-2000:]
  assert "compiled in" not in proc.stdout


@pytest.mark.parametrize(
  "topology, mesh, model, needle",
  [
    ("v5x:2x2", {}, "", "--topology='v5x:2x2' is unknown or malformed"),
    ("v5e:2x2x", {}, "", "--topology='v5e:2x2x' is unknown or malformed"),
    ("v5e:2x2", {"fsdp": 3}, "", "mesh fsdp=3 x tp=1 = 3 chips does not divide the 4 chips of v5e:2x2"),
    ("v5p:2x2x2", {"fsdp": 2, "tp": 2}, "", "mesh fsdp=2 x tp=2 = 4 chips does not divide the 8 chips"),
    ("v5e:2x2", {"fsdp": 4}, "gpt2-xl", "--model='gpt2-xl' is neither a preset"),
  ],
)
def test_bad_input_is_named_before_compiling(topology, mesh, model, needle):
  from agentfly_jax.rl.scale import aot

  with pytest.raises(aot.BadInput) as e:
    aot.compile_run(RunSpec.from_config(lookup_config(**mesh)), topology, model)
  assert needle in str(e.value)


def test_unsupported_hf_model_type_is_named(tmp_path):
  from agentfly_jax.rl.scale import aot

  path = tmp_path / "config.json"
  path.write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 768}))
  with pytest.raises(aot.BadInput, match=f"{path}: unknown architecture .model_type='gpt2'"):
    aot.compile_run(RunSpec.from_config(lookup_config(fsdp=4)), "v5e:2x2", str(path))
  with pytest.raises(aot.BadInput, match="unknown programs"):
    aot.compile_run(
      RunSpec.from_config(lookup_config(fsdp=4)), "v5e:2x2", "qwen2.5-0.5b", programs=("train_step", "backward")
    )


@pytest.mark.slow
def test_grpo_programs_compile_for_v5e_2x2(tmp_path):
  out = tmp_path / "grpo"
  # attention_impl "pallas" as in configs/tpu/: the Pallas flash kernel under shard_map, compiled by libtpu
  proc = aot(
    "--config=configs/lookup_grpo.py",
    "--topology=v5e:2x2",
    "--config.mesh.fsdp=4",
    "--config.model.attention_impl=pallas",
    f"--out={out}",
    *TINY,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads((tmp_path / "grpo.json").read_text())
  assert report["chips"] == 4 and report["mesh"]["fsdp"] == 4 and report["scan_layers"]
  assert report["attention_impl"] == "pallas"
  rows = {r["program"]: r for r in report["rows"]}
  assert set(rows) == {"prepare", "train_step", "sft_step", "sampler", "engine_prefill", "engine_decode", "weight_sync"}
  for name, row in rows.items():
    assert row["fits"] and row["hbm_bytes"] == 16 * 1024**3, name
    assert row["peak_bytes"] == row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"] + row["temp_bytes"]
    assert row["argument_bytes"] > 0 and row["compile_s"] > 0, name
  for name in ("prepare", "train_step", "sft_step", "sampler"):
    assert rows[name]["flops"] > 0, name
  # The train step's arguments hold the sharded state: f32 params + 2 Adam moments (12 bytes a param / 4 chips).
  assert rows["train_step"]["argument_bytes"] >= 12 * report["num_params"] / 4
  assert rows["train_step"]["floor_bytes"] > 0 and rows["train_step"]["memory_plan_bytes"] > 0
  # the estimate is the sum of its recorded parts, and re-estimating from its recorded inputs gives it back
  from agentfly_jax.rl.scale.aot_programs import estimate_from_inputs

  step = rows["train_step"]
  assert step["memory_plan_bytes"] == sum(step["memory_plan_parts"].values())
  assert step["memory_plan_inputs"]["run"]["backend"] == "tpu" and step["memory_plan_inputs"]["fsdp"] == 4
  assert estimate_from_inputs(step["memory_plan_inputs"])["total"] == step["memory_plan_bytes"]
  assert "| train_step |" in (tmp_path / "grpo.md").read_text()


def test_weight_sync_to_a_sampler_on_its_own_chips_is_a_transfer_row(tmp_path):
  """fsdp 2 for the trainer, the other 2 chips for the sampler: the sync is a device_put across
  disjoint devices (no XLA program can span them): what a trainer chip sends, a sampler chip receives."""
  out = tmp_path / "sync"
  proc = aot(
    "--config=configs/lookup_grpo.py",
    "--topology=v5e:2x2",
    "--config.mesh.fsdp=2",
    "--config.mesh.sampler_devices=2",
    "--programs=weight_sync",
    f"--out={out}",
    *TINY,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads((tmp_path / "sync.json").read_text())
  (row,) = report["rows"]
  assert row["program"] == "weight_sync" and row["transfer"] and row["fits"], row
  params_bytes = 4 * report["num_params"]  # float32 params: split over 2 trainer chips, and over 2 sampler chips
  assert params_bytes / 2 <= row["argument_bytes"] < params_bytes, row
  assert params_bytes / 2 <= row["output_bytes"] < params_bytes, row
  assert row["peak_bytes"] == max(row["argument_bytes"], row["output_bytes"])
  assert "a device_put between the trainer's and the sampler's devices" in proc.stdout


@pytest.mark.slow
def test_ppo_step_with_critic_that_cannot_fit_names_program_and_gib(tmp_path):
  out = tmp_path / "ppo"
  proc = aot(
    "--config=configs/lookup_ppo.py",
    "--topology=v5e:2x2",
    "--config.mesh.fsdp=4",
    f"--out={out}",
    "--programs=train_step",
    "--hbm_gib=0.001",
    *TINY,
  )
  assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "DOES NOT FIT: program train_step needs" in proc.stderr and "GiB over the 0 GiB of HBM" in proc.stderr
  assert "would fit:" in proc.stderr
  report = json.loads((tmp_path / "ppo.json").read_text())
  assert report["algo"] == "ppo" and not report["rows"][0]["fits"]
  # PPO: the critic's params and moments are in the state too (more than the policy's alone).
  assert report["rows"][0]["argument_bytes"] >= 2 * 12 * report["num_params"] / 4


def test_tpu_configs_validate():
  import importlib.util

  from agentfly_jax.models.presets import PRESETS
  from agentfly_jax.rl.config import validate_config

  folder = os.path.join(ROOT, "configs", "tpu")
  names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
  assert "qwen25_7b_grpo.py" in names
  for name in names:
    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(folder, name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.get_config()
    validate_config(cfg)
    assert cfg.model.scan_layers and cfg.model.aot_preset in PRESETS, name


def test_coordinator_auto_lets_jax_read_the_pod_environment(monkeypatch):
  import jax

  from agentfly_jax.rl import distributed

  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
  assert distributed.initialize("auto") is True
  assert calls == [((), {})]  # no address / ids: JAX finds them on a TPU VM


def test_per_chip_memory_plan_splits_state_over_chips_and_activations_over_fsdp():
  from agentfly_jax.rl.scale import memory_plan as mp

  shape = mp.ModelShape(
    num_params=7_615_616_512,
    num_layers=28,
    hidden_size=3584,
    num_heads=28,
    num_kv_heads=4,
    head_dim=128,
    vocab_size=152064,
  )
  sizes = mp.RunSizes(micro_batch=8, seq_len=2048, attention_chunk=512, remat=True, critic=True, scan_layers=True)
  layer = 233_057_792
  shape = dataclasses.replace(shape, layer_params=layer)
  whole = mp.jax_memory_parts(shape, sizes)
  chip = mp.per_chip_jax_parts(shape, sizes, fsdp=4, tp=2)
  assert chip["adam"] == int(2 * 7_615_616_512 * 4 / 8) and chip["critic"] == int(whole["critic"] / 8)
  assert chip["activations"] == int(whole["activations"] / 4) and chip["logits"] == int(whole["logits"] / 4)
  # one layer's gradients whole, split over tp only (the layer is gathered over fsdp)
  assert whole["layer grads"] == layer * 4 and chip["layer grads"] == layer * 4 // 2
  parts = [v for k, v in chip.items() if k != "total"]
  assert abs(chip["total"] - sum(parts)) <= len(parts)  # the estimate: no margin (the split check adds it)
  # accumulating micro-batches: params-sized buffers beside the gradients, by backend (the critic's
  # step reuses the policy step's: not doubled)
  for backend, buffers in mp.ACCUMULATOR_BUFFERS.items():
    accumulating = mp.per_chip_jax_parts(
      shape, dataclasses.replace(sizes, micro_batches=8, backend=backend), fsdp=4, tp=2
    )
    assert accumulating["grad accumulator"] == int(buffers * 7_615_616_512 * 4 / 8), backend
  assert "grad accumulator" not in chip
  # scanned layers: the compute-dtype copy is two gathered layers (split over tp) + the split embedding casts
  unrolled = mp.per_chip_jax_parts(shape, dataclasses.replace(sizes, scan_layers=False), fsdp=4, tp=2)
  assert unrolled["compute copy"] == int(7_615_616_512 * 2 / 8)
  assert chip["compute copy"] == int(2 * layer * 2 / 2 + (7_615_616_512 - 28 * layer) * 2 / 8)
  # unrolled layers accumulating: on a TPU mesh more params-sized buffers; on a GPU mesh none, but a
  # tied embedding table's gradient whole + the gathered table (split over tp only); on one device none
  unrolled_acc = dataclasses.replace(sizes, scan_layers=False, micro_batches=8)
  tpu = mp.per_chip_jax_parts(shape, dataclasses.replace(unrolled_acc, backend="tpu"), fsdp=4, tp=2)
  assert tpu["grad accumulator"] == int(mp.UNROLLED_ACCUMULATOR_BUFFERS["tpu"] * 7_615_616_512 * 4 / 8)
  gpu_untied = mp.per_chip_jax_parts(shape, dataclasses.replace(unrolled_acc, backend="gpu"), fsdp=4, tp=2)
  assert "grad accumulator" not in gpu_untied and "embedding grads" not in gpu_untied
  tied = dataclasses.replace(shape, tied_embeddings=True)
  gpu_tied = mp.per_chip_jax_parts(tied, dataclasses.replace(unrolled_acc, backend="gpu"), fsdp=4, tp=2)
  assert gpu_tied["embedding grads"] == 152064 * 3584 * (4 + 2) // 2
  for backend in ("tpu", "gpu"):
    one_device = dataclasses.replace(unrolled_acc, backend=backend)
    assert not {"grad accumulator", "embedding grads"} & set(mp.per_chip_jax_parts(tied, one_device, fsdp=1))
    assert not {"grad accumulator", "embedding grads"} & set(mp.jax_memory_parts(tied, one_device))
  with pytest.raises(ValueError, match="unknown backend 'cuda'"):
    mp.RunSizes(micro_batch=8, seq_len=2048, backend="cuda")


def test_replan_table_re_estimates_recorded_rows(tmp_path):
  """`--replan`: every train-step row with recorded inputs gets today's estimate (no compile); the
  markdown table is rewritten with it and its ratio to XLA's peak."""
  from agentfly_jax.rl.scale import aot, memory_plan as mp

  shape = mp.ModelShape(
    num_params=494_032_768,
    num_layers=24,
    hidden_size=896,
    num_heads=14,
    num_kv_heads=2,
    head_dim=64,
    vocab_size=151936,
    layer_params=14_912_384,
  )
  sizes = mp.RunSizes(micro_batch=2, micro_batches=8, seq_len=1024, remat=True, scan_layers=True, backend="tpu")
  inputs = {"model": dataclasses.asdict(shape), "run": dataclasses.asdict(sizes), "fsdp": 4, "tp": 1}
  peak = 3 * 1024**3
  row = dict(
    program="train_step",
    compile_s=60.0,
    argument_bytes=peak // 2,
    output_bytes=0,
    alias_bytes=0,
    temp_bytes=peak // 2,
    peak_bytes=peak,
    flops=1e12,
    hbm_bytes=16 * 1024**3,
    fits=True,
    micro_batch="8x8x1024",
    memory_plan_bytes=1,
    memory_plan_inputs=inputs,
  )
  old = dict(row, memory_plan_bytes=7)
  old.pop("memory_plan_inputs")  # compiled before rows recorded their inputs: kept as it is
  report = dict(
    topology="v5e:2x2",
    chips=4,
    hbm_gib=16.0,
    model="qwen2",
    num_params=shape.num_params,
    num_hidden_layers=24,
    scan_layers=True,
    remat="full",
    attention_impl="flash",
    dtype="bfloat16",
    param_dtype="float32",
    mesh={"fsdp": 4, "tp": 1, "sampler_devices": 0},
    algo="grpo",
    seq_len=1024,
    micro_batch_size=8,
  )
  prefix = str(tmp_path / "table")
  (tmp_path / "table.json").write_text(
    json.dumps([dict(report, label="new", rows=[row]), dict(report, label="old", rows=[old])])
  )
  assert aot.replan_table(prefix) == 1
  rows = {r["label"]: r["rows"][0] for r in json.loads((tmp_path / "table.json").read_text())}
  expected = mp.per_chip_jax_parts(shape, sizes, fsdp=4)["total"]
  assert rows["new"]["memory_plan_bytes"] == expected and rows["old"]["memory_plan_bytes"] == 7
  assert sum(rows["new"]["memory_plan_parts"].values()) == expected
  md = (tmp_path / "table.md").read_text()
  assert f"| {expected / 1024**3:.2f} | {expected / peak:.2f} |" in md


def test_xla_refusing_a_program_for_hbm_is_a_row_that_does_not_fit():
  """XLA itself refuses a program whose temporaries exceed the chip's HBM (Qwen2.5-7B on v5e:2x4):
  aot_compile reports it as a row that does not fit (then exits 2 naming it), not a traceback."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  from agentfly_jax.rl.scale import aot

  msg = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
    "(19.03G) exceeds available HBM (15.75G)."
  )
  row = aot.oom_row("train_step", msg, argument_bytes=3 * aot.GIB, seconds=1.5)
  assert row["xla_refused"] and row["temp_bytes"] == int(19.03 * aot.GIB)
  assert row["peak_bytes"] == 3 * aot.GIB + int(19.03 * aot.GIB) and row["flops"] is None
  assert aot.oom_row("train_step", "INVALID_ARGUMENT: something else", 0, 0.0) is None
  mesh = jax.sharding.Mesh(jax.devices()[:1], ("fsdp",))
  args = (
    {"w": jax.ShapeDtypeStruct((8, 6), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))},
    jax.ShapeDtypeStruct((5,), jnp.bfloat16),
    3,
  )
  assert aot.per_device_bytes(args) == 8 * 6 * 4 + 5 * 2


def test_pallas_attention_for_a_gpu_topology_is_named_before_compiling():
  from agentfly_jax.rl.scale import aot

  config = lookup_config(fsdp=8)
  config.model.attention_impl = "pallas"
  with pytest.raises(aot.BadInput, match="attention_impl='pallas' is the TPU kernel and --topology='h100:8' is a GPU"):
    aot.compile_run(RunSpec.from_config(config), "h100:8")


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_one_layers_parameter_count_is_the_same_scanned_or_unrolled(family):
  """The plan's 'layer grads' and the floor's gathered layer read one decoder layer's size: the
  stacked size of a scanned model, layer 0's of an unrolled one (not all params / layers)."""
  from flax import nnx

  from agentfly_jax.models import CausalLM, tiny_config
  from agentfly_jax.rl.scale.aot_programs import _parameter_counts

  counts = {}
  for scan in (True, False):
    cfg = tiny_config(family, vocab_size=97, num_hidden_layers=3, scan_layers=scan)
    params = nnx.state(nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    counts[scan] = _parameter_counts(params, 3)
  assert counts[True] == counts[False]
  num_params, layer = counts[True]
  embed = 97 * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2) + cfg.hidden_size  # + the final norm
  assert num_params == 3 * layer + embed and layer != num_params // 3


@pytest.mark.parametrize("table", ["aot_tpu", "aot_gpu"])
def test_memory_plan_is_within_15_percent_of_every_recorded_xla_row(table):
  """Today's rl/scale/memory_plan.py re-estimates every committed train-step row (TPU and GPU compiles of
  0.5B-32B models, scanned and unrolled, one to 64 chips) from the inputs it recorded: within 15 % of
  XLA's per-chip peak. Rows XLA refused (it stops before scheduling, in seconds) are left out."""
  from agentfly_jax.rl.scale.aot_programs import estimate_from_inputs

  with open(os.path.join(ROOT, "lab", "results", table + ".json")) as f:
    reports = json.load(f)
  checked = []
  for r in reports:
    for row in r["rows"]:
      if row["program"] == "train_step" and not row.get("xla_refused"):
        ratio = estimate_from_inputs(row["memory_plan_inputs"])["total"] / row["peak_bytes"]
        checked.append((r["label"], r["topology"], r["scan_layers"], round(ratio, 3)))
  assert len(checked) >= 8
  assert all(0.85 <= ratio <= 1.15 for *_, ratio in checked), checked


def test_paged_engine_programs_compile_for_tpu_with_the_cache_in_their_arguments():
  """The paged engine's prefill chunk and decode block (rl/scale/aot_engine.py) compiled for v5p:2x2x1 from
  abstract values, attention_impl "pallas" as in configs/tpu/ (decode steps through the Pallas paged-attention
  kernel under shard_map, megacore split by kv head on v5p): each row's cache bytes a chip are the sampler's
  whole cache (kv heads on tp = 1, so every chip holds every page), inside its argument bytes and aliased out
  (the cache is donated)."""
  from agentfly_jax.rl.scale import aot, aot_engine

  config = lookup_config(fsdp=4)
  config.model.scan_layers = True
  config.model.attention_impl = "pallas"
  config.model.dtype = "bfloat16"
  config.rollout.update(max_batch_size=4, max_total_tokens=48, max_tokens_per_turn=16, kv_page_size=16)
  config.rollout.decode_steps = 2
  spec = RunSpec.from_config(config)
  report = aot.compile_run(spec, "v5p:2x2x1", programs=("engine_prefill", "engine_decode"))
  rows = {r["program"]: r for r in report["rows"]}
  assert list(rows) == ["engine_prefill", "engine_decode"] and report["attention_impl"] == "pallas"
  cfg = aot.model_config(spec, None, "config")
  sizes = aot_engine.engine_sizes(aot.abstract_run(spec, cfg, aot.topology_devices("v5p:2x2x1"), 64))
  assert sizes.num_pages == 4 * 4 + 1 and sizes.table_width == 8  # 4 slots x 64 tokens / 16 + the sink
  cache = 2 * cfg.num_hidden_layers * sizes.num_pages * 16 * cfg.num_key_value_heads * cfg.head_dim * 2  # bf16
  for name, row in rows.items():
    assert row["cache_bytes"] == cache and row["cache_pages"] == sizes.num_pages, name
    assert cache <= row["argument_bytes"] and cache <= row["alias_bytes"], (name, row)
    assert row["fits"] and row["temp_bytes"] >= 0 and row["flops"] > 0, name
    assert row["peak_bytes"] == row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"] + row["temp_bytes"]
  assert "4 slots x 2 steps" in rows["engine_decode"]["micro_batch"]
  assert rows["engine_prefill"]["micro_batch"].startswith("1x128 chunk")


def test_an_engine_row_that_does_not_fit_is_advised_a_smaller_kv_cache():
  from agentfly_jax.rl.scale import aot

  g = aot.GIB
  row = dict(program="engine_decode", peak_bytes=60 * g, cache_bytes=20 * g, hbm_bytes=32 * g)
  advice = aot.fit_advice({"remat": "full", "chips": 8, "micro_batch_size": 8}, row)
  assert advice.startswith("--config.rollout.kv_cache_gib=") and "20.00 GiB a chip now" in advice
  gib = float(advice.split("=")[1].split()[0])
  assert 0.85 * 32 * g <= 20 * g + 2 * gib * g <= 0.9 * 32 * g + 0.01 * g  # the rest + twice the cache: ~90 % of HBM
  heavy = dict(row, peak_bytes=60 * g, cache_bytes=5 * g)
  assert "without its KV cache the program still needs 50.00 GiB" in aot.fit_advice({}, heavy)


def test_the_teacher_program_needs_a_teacher():
  from agentfly_jax.rl.scale import aot

  with pytest.raises(aot.BadInput, match=r"config.teacher.pretrained='': the teacher program needs a teacher"):
    aot.compile_run(RunSpec.from_config(lookup_config(fsdp=4)), "v5e:2x2", programs=("teacher",))
  config = lookup_config(fsdp=4)
  config.teacher.pretrained, config.loss.distill_weight = "gpt2-xl", 1.0
  with pytest.raises(aot.BadInput, match=r"config.teacher.pretrained='gpt2-xl': neither a preset"):
    aot.compile_run(RunSpec.from_config(config), "v5e:2x2", programs=("teacher",))


@pytest.mark.slow
def test_a_larger_teachers_forward_compiles_beside_prepare(tmp_path):
  """On-policy distillation's teacher (2x the student's width, 3 layers) on the student's mesh: its params split
  over the 4 chips, more FLOPs than the student's own log-prob pass in prepare."""
  import jax

  from agentfly_jax.models import tiny_config

  teacher = tmp_path / "teacher"
  teacher.mkdir()
  cfg = tiny_config("qwen2", vocab_size=668, hidden_size=256, intermediate_size=512, num_hidden_layers=3)
  (teacher / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
  out = tmp_path / "distill"
  proc = aot(
    "--config=configs/lookup_grpo.py",
    "--topology=v5e:2x2",
    "--config.mesh.fsdp=4",
    f"--config.teacher.pretrained={teacher}",
    "--config.loss.distill_weight=1.0",
    "--programs=prepare,teacher",
    f"--out={out}",
    *TINY,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rows = {r["program"]: r for r in json.loads((tmp_path / "distill.json").read_text())["rows"]}
  assert list(rows) == ["prepare", "teacher"]
  t = rows["teacher"]
  assert t["fits"] and t["micro_batch"].startswith("teacher teacher: 8x64")
  import numpy as np
  from flax import nnx

  from agentfly_jax.models import CausalLM

  shapes = nnx.state(nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert 4 * params / 4 <= t["argument_bytes"] < 4 * params  # f32 params split over the 4 chips
  assert t["flops"] > rows["prepare"]["flops"] > 0


@pytest.mark.parametrize("replay, key", [("rollout", "routed_experts"), ("off", "rollout_experts")])
def test_a_mixture_of_experts_step_carries_the_samplers_routes(replay, key):
  """The AOT prepare / train_step rows of an MoE policy take the sampler's routes int32[rows, T, Lm, k] as a run
  does (rl/update.py put_arrays): replayed under model.router_replay=rollout, else only measured; a dense policy's
  arrays have none. Abstract values only (nothing compiled)."""
  import jax.numpy as jnp

  from agentfly_jax.models import tiny_config
  from agentfly_jax.rl.scale import aot
  from agentfly_jax.rl.scale.aot_programs import abstract_run, abstract_step_arrays

  config = lookup_config(fsdp=2, expert=2)
  config.model.router_replay = replay
  spec = RunSpec.from_config(config)
  devices = aot.topology_devices("v5e:2x2")
  moe = tiny_config("qwen3_moe", vocab_size=97, num_hidden_layers=2, scan_layers=True)
  n_rows, arrays = abstract_step_arrays(abstract_run(spec, moe, devices, 64))
  assert arrays[key].shape == (n_rows, 64, 2, moe.num_experts_per_tok) and arrays[key].dtype == jnp.int32
  assert ({"routed_experts", "rollout_experts"} - {key}).isdisjoint(arrays)
  dense = tiny_config("qwen3", vocab_size=97, num_hidden_layers=2, scan_layers=True)
  _, dense_arrays = abstract_step_arrays(abstract_run(spec, dense, devices, 64))
  assert not {"routed_experts", "rollout_experts"} & set(dense_arrays)


def test_expert_parallel_floor_and_memory_plan_split_the_experts_over_the_expert_axis():
  """On an fsdp x expert mesh the state splits over every chip, a chip gathers only its own experts of a layer,
  and rows split over the chips the activation rule names; the floor adds the all_to_all's sent and received
  assignments (k a token)."""
  from agentfly_jax.models import tiny_config
  from agentfly_jax.rl.scale import memory_plan as mp
  from agentfly_jax.rl.scale.aot_programs import train_step_floor

  shape = mp.ModelShape(
    num_params=30_000_000_000,
    num_layers=48,
    hidden_size=2048,
    num_heads=32,
    num_kv_heads=4,
    head_dim=128,
    vocab_size=151936,
    layer_params=630_000_000,
    layer_expert_params=600_000_000,
  )
  sizes = mp.RunSizes(micro_batch=8, seq_len=2048, remat=True, scan_layers=True, fused_attention=True)
  chip = mp.per_chip_jax_parts(shape, sizes, fsdp=2, expert=4, rows=8)
  whole = mp.jax_memory_parts(shape, sizes, sharded=True)
  assert chip["adam"] == int(whole["adam"] / 8) and chip["activations"] == int(whole["activations"] / 8)
  assert chip["layer grads"] == int((30_000_000 + 600_000_000 / 4) * 4)
  assert chip["compute copy"] == int(2 * (30_000_000 + 600_000_000 / 4) * 2 + (30e9 - 48 * 630_000_000) * 2 / 8)
  # a dense mesh (expert 1, rows over fsdp) is the plan as before
  dense = mp.per_chip_jax_parts(dataclasses.replace(shape, layer_expert_params=0), sizes, fsdp=8)
  assert dense["layer grads"] == 630_000_000 * 4 and dense["activations"] == int(whole["activations"] / 8)
  cfg = tiny_config(
    "qwen3_moe", vocab_size=97, hidden_size=2048, num_hidden_layers=48, num_experts_per_tok=8, dtype="bfloat16"
  )
  floor = train_step_floor(
    cfg, 30_000_000_000, 630_000_000, 8, 2048, 8, 2, False, expert=4, layer_expert_params=6e8, row_split=8
  )
  state, gathered = 30e9 * 16 / 8, (30e6 + 6e8 / 4) * 2
  acts, exchange = 48 * 1 * 2048 * 2048 * 2, 2 * (8 * 2048 // 8) * 8 * 2048 * 2
  assert floor == int(state + gathered + acts + exchange)
