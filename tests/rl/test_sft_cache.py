"""The SFT warm start's cache (`sft.cache_dir`) and its per-step hook: the params after k steps of
a longer SFT are a k-step SFT's (constant lr, step i's demos depend on i only), so
`train_sft(..., after_step=)` can cache several step counts from one SFT under the keys runs read."""

import copy
import dataclasses
import importlib.util
import os

import jax
import numpy as np
import pytest
from train_cli import ROOT

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


def _config(tmp_path, steps: int):
  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, "configs", "lookup_grpo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.sft.steps, c.sft.rows_per_step, c.sft.tool_use_prob, c.sft.lr = steps, 4, 0.5, 1e-3
  c.sft.cache_dir = str(tmp_path / "sft_cache")
  c.log.tensorboard = c.log.progress = False
  return c


@pytest.mark.slow
def test_k_steps_of_a_longer_sft_are_a_k_step_sft_and_cached_under_its_key(tmp_path):
  from agentfly_jax.rl.run import open_run
  from agentfly_jax.rl.sft_cache import sft_cache_path, sft_params, train_sft
  from agentfly_jax.rl.spec import RunSpec

  long_run = open_run(RunSpec.from_config(_config(tmp_path, 3)), str(tmp_path / "run3"))
  seen = {}
  train_sft(long_run, after_step=lambda k, params: seen.__setitem__(k, jax.device_get(copy.deepcopy(params))))
  assert sorted(seen) == [1, 2, 3]
  short_run = open_run(RunSpec.from_config(_config(tmp_path, 2)), str(tmp_path / "run2"))
  assert sft_cache_path(long_run, steps=2) == sft_cache_path(short_run) != sft_cache_path(long_run)
  params, metrics = sft_params(short_run)  # trains 2 steps and caches them
  assert metrics and os.path.isdir(sft_cache_path(short_run))
  flat = lambda tree: [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]  # noqa: E731
  for got, want in zip(flat(seen[2]), flat(params), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  moved = [np.abs(a - b).max() for a, b in zip(flat(seen[3]), flat(seen[2]))]
  assert max(moved) > 1e-4  # the third step trained: the hook saw each step's own params
  key = sft_cache_path(short_run)
  spec = short_run.spec  # frozen: the variants are copies with other rollout fields

  def with_rollout(**fields):  # the same run with another spec (the key reads only the spec)
    other = dataclasses.replace(spec, rollout=dataclasses.replace(spec.rollout, **fields))
    return sft_cache_path(dataclasses.replace(short_run, spec=other))

  assert with_rollout(temperature=0.7, num_chains=8, rows_per_step=3) == key  # RL's, not the demos'
  assert with_rollout(max_turns=spec.rollout.max_turns + 1) != key  # the demos' limit: another SFT
  cached, none = sft_params(short_run)  # read back, nothing trained
  assert none == {}
  for got, want in zip(flat(cached), flat(params), strict=True):
    np.testing.assert_array_equal(got, want)
