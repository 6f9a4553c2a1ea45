"""LoRA on the (fsdp, tp) mesh: tests/lora_mesh_check.py in a subprocess on 8 fake CPU devices."""
import os
import subprocess
import sys

import pytest


@pytest.mark.slow  # ~40-90 s: 8-device compile
def test_lora_train_step_on_2x2_mesh_matches_one_device():
  script = os.path.join(os.path.dirname(__file__), "lora_mesh_check.py")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0 and "LORA MESH OK" in out.stdout, out.stderr[-4000:]
