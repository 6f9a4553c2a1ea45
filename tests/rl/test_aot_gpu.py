"""rl/scale/aot_gpu.py + rl/scale/aot.py's GPU topologies (`h100:8`): a deviceless compile for abstract NVIDIA
GPUs on this CPU. The topology names are checked everywhere; the compiles need the CUDA PJRT plugin
and a CUDA toolkit (`pip install -e .[aot-gpu]`) and are skipped without them (CI has neither)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentfly_jax.rl.scale import aot, aot_gpu
from train_cli import AOT_TINY_FLAGS, ROOT  # noqa: E402

needs_plugin = pytest.mark.skipif(
  not aot_gpu.plugin_available(), reason="the CUDA PJRT plugin (pip install -e .[aot-gpu]) is not installed"
)
H100_BYTES = aot_gpu.GPUS["h100"].memory_bytes
TINY = AOT_TINY_FLAGS


@pytest.mark.parametrize(
  "name, expected",
  [("h100:1", ("h100", 1)), ("h100:8", ("h100", 8)), ("h200:16", ("h200", 16)), ("v5p:2x2x2", ("v5p", 8))],
)
def test_topology_names(name, expected):
  assert aot.parse_topology(name) == expected


@pytest.mark.parametrize(
  "name, needle",
  [
    ("h100:12", "--topology='h100:12': 12 GPUs do not fill hosts of 8"),
    ("h100:0", "--topology='h100:0': needs at least one GPU"),
    ("a100:8", "--topology='a100:8' is unknown or malformed"),
    ("h100:2x2", "--topology='h100:2x2' is unknown or malformed"),
  ],
)
def test_bad_gpu_topology_is_named(name, needle):
  with pytest.raises(aot.BadInput) as e:
    aot.parse_topology(name)
  assert needle in str(e.value)
  if "unknown" in needle:
    assert "h100:8" in str(e.value)  # the message shows the GPU form too


def test_topology_string_splits_hosts_of_eight():
  assert aot_gpu.topology_string(1, 8) == "1x1x1"
  assert aot_gpu.topology_string(8, 8) == "1x1x8"
  assert aot_gpu.topology_string(32, 8) == "1x4x8"


def test_target_config_carries_the_spec():
  spec = aot_gpu.GPUS["h200"]
  text = aot_gpu.target_config(spec)
  assert f"device_memory_size: {spec.memory_bytes}\n" in text and "core_count: 132\n" in text
  assert "cuda_compute_capability { major: 9 minor: 0 feature_extension: ACCELERATED_FEATURES }" in text
  assert 'device_description_str: "NVIDIA H200 141GB HBM3e"' in text and 'platform_name: "CUDA"' in text
  assert aot.HBM_GIB["h100"] == pytest.approx(79.11, abs=0.01)


@pytest.mark.skipif(aot_gpu.plugin_available(), reason="the plugin is installed")
def test_without_the_plugin_a_gpu_topology_names_the_extra():
  with pytest.raises(aot.BadInput, match=r"--topology='h100:8': .*pip install -e \.\[aot-gpu\]"):
    aot.topology_devices("h100:8")


@needs_plugin
def test_abstract_h100s_on_two_hosts():
  devices = aot_gpu.gpu_devices("h100", 16)
  assert len(devices) == 16 and {d.device_kind for d in devices} == {"NVIDIA H100 80GB HBM3"}
  assert sorted({d.process_index for d in devices}) == [0, 1]


@needs_plugin
def test_sharded_matmul_compiles_for_h100_with_per_device_bytes():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  mesh = Mesh(np.array(aot_gpu.gpu_devices("h100", 4)), ("x",))
  x = jax.ShapeDtypeStruct((4096, 1024), jnp.float32, sharding=NamedSharding(mesh, P("x")))
  w = jax.ShapeDtypeStruct((1024, 768), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
  compiled = jax.jit(lambda x, w: jnp.tanh(x.astype(jnp.bfloat16) @ w)).lower(x, w).compile()
  mem = compiled.memory_analysis()
  assert mem.argument_size_in_bytes == 4096 // 4 * 1024 * 4 + 1024 * 768 * 2
  assert mem.output_size_in_bytes == 4096 // 4 * 768 * 2
  assert "num_partitions=4" in compiled.as_text()


@needs_plugin
@pytest.mark.slow
def test_grpo_programs_compile_for_h100x2(tmp_path):
  """Every program of the tiny GRPO run compiles for 2 abstract H100s, the paged engine's too: with
  attention_impl "flash" its decode steps read the cache through the gather-based XLA path (models/
  paged_attention.paged_attend; the Pallas kernel is TPU-only); each engine row holds the whole cache a GPU,
  donated (aliased out)."""
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "aot_compile.py"),
      "--config=configs/lookup_grpo.py",
      "--topology=h100:2",
      "--config.mesh.fsdp=2",
      f"--out={tmp_path / 'grpo'}",
      *TINY,
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads((tmp_path / "grpo.json").read_text())
  assert report["topology"] == "h100:2" and report["chips"] == 2 and report["mesh"]["fsdp"] == 2
  rows = {r["program"]: r for r in report["rows"]}
  assert list(rows) == [
    "prepare",
    "train_step",
    "sft_step",
    "sampler",
    "engine_prefill",
    "engine_decode",
    "weight_sync",
  ]
  for name, row in rows.items():
    assert row["fits"] and abs(row["hbm_bytes"] - H100_BYTES) <= 1 and row["flops"] is None, name
    assert row["peak_bytes"] >= row["argument_bytes"] > 0, name
  assert report["attention_impl"] == "flash" and report["dtype"] == "float32"
  from agentfly_jax.rl.spec import RunSpec  # imported here: where the test is skipped (CI) the file stays light
  from train_cli import load_script

  spec = RunSpec.from_config(load_script("configs/lookup_grpo.py").get_config())
  cfg = aot.model_config(spec, *aot.load_hf_config("", spec))  # the warm start's shapes, as the tool reads them
  pages = 8 * (64 + 16) // 16 + 1  # max_batch_size slots at max_len (max_total_tokens + one turn) + the sink page
  cache = 2 * cfg.num_hidden_layers * pages * 16 * cfg.num_key_value_heads * cfg.head_dim * 4  # float32 K and V
  for name in ("engine_prefill", "engine_decode"):
    row = rows[name]
    assert row["cache_pages"] == pages and row["cache_bytes"] == cache, (name, row)  # whole on each chip (tp 1)
    assert cache <= row["argument_bytes"] and cache <= row["alias_bytes"], (name, row)  # donated: aliased out
    assert row["peak_bytes"] == row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"] + row["temp_bytes"]
  assert rows["engine_decode"]["micro_batch"].startswith("8 slots x 4 steps, tables of 8 pages")
  assert rows["engine_prefill"]["micro_batch"].startswith("1x128 chunk")
