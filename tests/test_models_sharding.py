"""8 fake CPU devices, in a subprocess: 2x4 and 4x2 (fsdp, tp) meshes equal one device, and each
param's sharding equals its rule (see tests/sharding_check.py)."""
import os
import subprocess
import sys

import pytest
from jax.sharding import PartitionSpec as P

from agentfly_jax.models import make_mesh, partition_spec_for


def test_forward_on_8_fake_devices_matches_single_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  script = os.path.join(os.path.dirname(__file__), "sharding_check.py")
  proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600,
                        cwd=os.path.dirname(os.path.dirname(__file__)))
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "SHARDING OK" in proc.stdout


def test_partition_rule_drops_axes_that_do_not_divide():
  class FakeMesh:
    shape = {"fsdp": 2, "tp": 4}
  assert partition_spec_for(("model", "embed_tokens", "embedding"), (250, 128), FakeMesh) == P(None, "fsdp")
  assert partition_spec_for(("model", "embed_tokens", "embedding"), (256, 128), FakeMesh) == P("tp", "fsdp")
  assert partition_spec_for(("lm_head", "kernel"), (128, 250), FakeMesh) == P("fsdp", None)
  with pytest.raises(KeyError, match="rotary"):
    partition_spec_for(("model", "rotary", "inv_freq"), (16,))


def test_make_mesh_checks_device_count():
  with pytest.raises(ValueError, match="needs 16 devices"):
    make_mesh(fsdp=4, tp=4)
  mesh = make_mesh(fsdp=-1, tp=1)
  assert mesh.axis_names == ("fsdp", "tp")
