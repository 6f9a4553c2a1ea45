"""Expert parallelism of the Qwen3-MoE: tests/moe_ep_check.py, in the test run's one 8-device child
process (tests/eight_device_checks.py)."""

import pytest


@pytest.mark.slow
@pytest.mark.eight_devices("moe_ep")
def test_expert_parallel_equals_one_device(eight_device_check):
  assert eight_device_check["ok"] and "MOE EP OK" in eight_device_check["output"], eight_device_check["output"]
