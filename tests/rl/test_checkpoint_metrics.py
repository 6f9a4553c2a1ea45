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


def _pixels_of(png: str, rgb: tuple[int, int, int], tolerance: int = 40) -> int:
  from PIL import Image

  image = np.asarray(Image.open(png).convert("RGB"), dtype=np.int32)
  return int((np.abs(image - np.array(rgb)).max(axis=-1) <= tolerance).sum())


def test_identical_curves_stay_visible(tmp_path):
  """Reward and success logged as the same values (a 0/1 reward): the second line drawn must not
  hide the first. Pixels of the first line's colour (matplotlib's C0) with both plotted are a good
  share of those with the first alone (the legend's sample alone is a small share)."""
  rng = np.random.default_rng(3)
  values = rng.uniform(0, 1, size=40).round(2)
  records = [{"step": i, "reward": float(v), "success": float(v)} for i, v in enumerate(values)]
  c0 = (31, 119, 180)
  alone = _pixels_of(plot_curves(records, ["reward"], str(tmp_path / "alone.png")), c0)
  both = _pixels_of(plot_curves(records, ["reward", "success"], str(tmp_path / "both.png")), c0)
  assert both >= 0.3 * alone, (both, alone)
