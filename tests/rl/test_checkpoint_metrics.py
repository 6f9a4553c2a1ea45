"""Orbax checkpoints round-trip a training-state pytree + metadata; keep-last-N holds;
metric writers produce what readers and plots consume."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentfly_jax.checkpoint import Checkpointer
from agentfly_jax.metrics import JsonlWriter, plot_curves, read_jsonl, truncate_jsonl, TensorBoardWriter


def _state(seed):
  rng = np.random.default_rng(seed)
  params = {
    "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
    "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
  }
  opt = optax.adamw(1e-3)
  return {
    "params": params,
    "opt_state": opt.init(params),
    "step": jnp.asarray(seed, jnp.int32),
    "rng": jax.random.key_data(jax.random.key(seed)),
  }


def test_roundtrip_and_keep_last(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=2, async_save=True)
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), {"data_position": step * 10, "note": "x"})
  ckpt.wait()
  assert ckpt.all_steps() == [2, 3]
  restored, meta = ckpt.restore(None, _state(0))
  expected = _state(3)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert meta == {"data_position": 30, "note": "x"}
  ckpt.close()


def test_restore_without_checkpoint_names_directory(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "empty"))
  with pytest.raises(FileNotFoundError, match="empty"):
    ckpt.restore(None, _state(0))


def test_jsonl_resume_truncation_and_plot(tmp_path):
  path = str(tmp_path / "m.jsonl")
  w = JsonlWriter(path)
  for s in range(5):
    w.write(s, {"reward/mean": np.float32(s / 4), "nan": float("nan"), "arr": jnp.arange(2)})
  w.close()
  recs = read_jsonl(path)
  assert [r["step"] for r in recs] == list(range(5)) and recs[4]["reward/mean"] == 1.0
  assert recs[0]["arr"] == [0, 1] and recs[0]["nan"] == "nan"
  truncate_jsonl(path, 2)
  assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2]
  png = plot_curves(read_jsonl(path), ["reward/mean"], str(tmp_path / "r.png"))
  assert os.path.getsize(png) > 1000
  tb = TensorBoardWriter(str(tmp_path / "tb"))
  tb.write(0, {"a": 1.0, "skip": "text"})
  tb.close()
  assert any(f.startswith("events") for f in os.listdir(tmp_path / "tb"))
