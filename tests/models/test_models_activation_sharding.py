"""Activation shardings by logical axis name (models/sharding.py `activation_sharding` /
`constrain`): a no-op without a multi-device mesh; on the 8-fake-device CPU mesh the constrained
train step, prepare and sampler equal the unconstrained ones (tests/activation_sharding_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentfly_jax.models import make_mesh
from agentfly_jax.models.sharding import ACTIVATION_AXES, DEFAULT_RULES, activation_sharding, constrain


def test_constrain_is_a_no_op_without_a_multi_device_mesh():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 3, 8)), jnp.float32)

  def f(v):
    return constrain(v * 2, ("act_batch", "act_length", "act_embed"))

  plain = jax.jit(f).lower(x).as_text()
  with activation_sharding(make_mesh(1, 1)):  # one device: nothing constrained
    one = jax.jit(f).lower(x).as_text()
  assert "sharding_constraint" not in plain and "Sharding" not in plain
  assert one == plain
  np.testing.assert_array_equal(jax.jit(f)(x), x * 2)


def test_activation_rules_are_in_the_defaults_and_the_config():
  from agentfly_jax.rl.config import default_config

  rules = default_config().mesh.rules
  for name in ACTIVATION_AXES:
    assert name in DEFAULT_RULES and name in rules
  assert DEFAULT_RULES["act_batch"] == "fsdp" and DEFAULT_RULES["act_embed"] is None


@pytest.mark.slow
@pytest.mark.eight_devices("activation_sharding")
def test_constrained_programs_equal_unconstrained_on_8_fake_devices(eight_device_check):
  """tests/activation_sharding_check.py, in the test run's one 8-device child process."""
  assert eight_device_check["ok"] and "ACTIVATION SHARDING OK" in eight_device_check["output"], eight_device_check[
    "output"
  ]
