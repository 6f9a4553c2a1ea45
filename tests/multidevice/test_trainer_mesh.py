"""The full trainer (README demo: JAX sampler rollout, prepare, train steps, weight sync) on 8 CPU
devices gives the same metrics as on one device: PPO, its policy and critic on a (fsdp=2, tp=2) trainer
mesh, its sampler on the other 4 devices (tests/mesh_trainer_check.py, run in the test run's one 8-device
child process: tests/eight_device_checks.py). GRPO and the other critic-free algorithms run the same
policy programs without the critic's."""

import pytest


@pytest.mark.slow
@pytest.mark.eight_devices("trainer_mesh")
def test_trainer_on_a_mesh_with_a_sampler_sub_mesh_matches_one_device(eight_device_check):
  """tests/mesh_trainer_check.py's check("ppo"), in the test run's 8-device child process."""
  assert eight_device_check["ok"], eight_device_check["output"]
  assert "ppo: " in eight_device_check["output"]
  assert "metrics equal on 1x1 and 2x2 mesh + 4 sampler devices" in eight_device_check["output"]
