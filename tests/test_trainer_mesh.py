"""The full trainer (README demo: JAX sampler rollout, prepare, train steps, weight sync) on a
(fsdp=2, tp=4) mesh of 8 CPU devices gives the same metrics as on one device, for a
critic-free policy algorithm (GRPO) and PPO with its critic (tests/mesh_trainer_check.py runs in
a subprocess with 8 forced host devices)."""
import os
import subprocess
import sys

import pytest
from train_cli import ROOT


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_trainer_on_2x4_mesh_matches_one_device(algo):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "mesh_trainer_check.py"), algo],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
  assert out.returncode == 0 and "OK" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
