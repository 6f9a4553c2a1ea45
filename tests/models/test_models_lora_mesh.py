"""LoRA on the (fsdp, tp) mesh: tests/lora_mesh_check.py, in the test run's one 8-device child
process (tests/eight_device_checks.py)."""

import pytest


@pytest.mark.slow
@pytest.mark.eight_devices("lora_mesh")
def test_lora_train_step_on_2x2_mesh_matches_one_device(eight_device_check):
  assert eight_device_check["ok"] and "LORA MESH OK" in eight_device_check["output"], eight_device_check["output"]
