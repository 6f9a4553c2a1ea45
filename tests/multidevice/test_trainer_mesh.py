"""The full trainer (README demo: JAX sampler rollout, prepare, train steps, weight sync) on 8 CPU
devices gives the same metrics as on one device: PPO with its critic on a (fsdp=2, tp=4) mesh, GRPO
on a (2, 2) trainer mesh with its sampler on the other 4 devices (tests/mesh_trainer_check.py, run in
the session's one 8-device child process: tests/eight_device_checks.py)."""

import pytest


@pytest.mark.slow
@pytest.mark.parametrize(
  "algo",
  [
    pytest.param("grpo", marks=pytest.mark.eight_devices("trainer_mesh_grpo")),
    pytest.param("ppo", marks=pytest.mark.eight_devices("trainer_mesh_ppo")),
  ],
)
def test_trainer_on_2x4_mesh_matches_one_device(algo, eight_device_check):
  """tests/mesh_trainer_check.py's check(algo), in the session's 8-device child process."""
  assert eight_device_check["ok"], eight_device_check["output"]
  mesh = {"grpo": "2x2 mesh + 4 sampler devices", "ppo": "2x4 mesh"}[algo]
  assert (
    f"{algo}: " in eight_device_check["output"] and f"metrics equal on 1x1 and {mesh}" in eight_device_check["output"]
  )
