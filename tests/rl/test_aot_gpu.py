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
  assert set(rows) == {"prepare", "train_step", "sft_step", "sampler", "weight_sync"}
  for name, row in rows.items():
    assert row["fits"] and abs(row["hbm_bytes"] - H100_BYTES) <= 1 and row["flops"] is None, name
    assert row["peak_bytes"] >= row["argument_bytes"] > 0, name
