"""A vision-language policy's train arrays: each row's images as fixed-size per-row arrays.

    arrays = train_arrays(trajs, pad_id=..., multiple=64)
    arrays.update(image_arrays(trajs, processor, model_cfg, length=arrays["input_ids"].shape[1]))

Each row carries its own images (so selecting rows for micro-batches or chunks carries them along):
pixel_values [B, P, patch_dim] with P the most patches of any row rounded up to `patch_multiple`, the
row's vision layout (models/vision.py VisionLayout, row-local indices) and M-RoPE positions mrope_positions [B, 3, L]
(models/qwen25_vl.mrope_positions of the inputs). A row's patches past its own images form one padded
image: it attends only to itself in the tower (its own frame and windows), and its merged features are
never scattered into the LM (each row's image tokens take its real features first), so padding
changes no log-prob. The layout's shapes depend on P alone, not on the number of images, so one
compiled program serves every batch of the same (B, L, P).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentfly_jax.models.vision import padded_layout
from agentfly_jax.rl.batching import bucket
from agentfly_jax.rl.core.vision import LAYOUT_KEYS, VISION_KEYS


def row_images(traj, processor) -> tuple[np.ndarray, np.ndarray]:
  """(pixel_values f32[N, patch_dim], image_grid_thw int32[I, 3]) of a trajectory's images,
  rebuilt by `processor` (vision/processor.py); its grids must equal the trajectory's recorded ones."""
  pixels, grids = processor.process(traj.images)
  if not np.array_equal(grids.reshape(-1, 3), traj.image_grid_thw):
    raise ValueError(
      f"Trajectory(group {traj.group_id}, chain {traj.chain_id}): its images give grids {grids.tolist()} "
      f"but it recorded image_grid_thw {traj.image_grid_thw.tolist()} (another image processor?)"
    )
  return pixels, grids


def image_arrays(trajs: Sequence, processor, model_cfg, *, length: int, patch_multiple: int = 256) -> dict:
  """Per-row image arrays of `trajs` for inputs of length L = `length` (train_arrays' input_ids:
  token t of each trajectory at position t).

  Returns {"pixel_values" f32[B, P, patch_dim], "mrope_positions" int32[B, 3, L] (M-RoPE of the inputs),
  "vision_window_index" / "vision_reverse_index" int32[B, P / m^2], "vision_full_segments" /
  "vision_window_segments" int32[B, P], "vision_rotary_positions" int32[B, P, 2]}; P = the most
  patches of any row rounded up to `patch_multiple` (a multiple of m^2: few shapes, few compilations).
  """
  from agentfly_jax.models.qwen25_vl import mrope_positions

  vcfg = model_cfg.vision
  if vcfg is None:
    raise ValueError(f"image_arrays: model_type {model_cfg.model_type!r} has no vision tower")
  unit = vcfg.spatial_merge_size**2
  if patch_multiple < 1 or patch_multiple % unit:
    raise ValueError(f"image_arrays: patch_multiple={patch_multiple} must be a positive multiple of {unit}")
  rows = [row_images(t, processor) if t.images else (np.zeros((0, vcfg.patch_dim), np.float32), None) for t in trajs]
  num_patches = bucket(max(len(p) for p, _ in rows), patch_multiple)
  out = {k: [] for k in VISION_KEYS}
  for traj, (pixels, grids) in zip(trajs, rows):
    grids = np.zeros((0, 3), np.int64) if grids is None else grids
    layout, _ = padded_layout(grids, num_patches, vcfg)
    for k in LAYOUT_KEYS:
      out[f"vision_{k}"].append(getattr(layout, k))
    padded = np.zeros((num_patches, vcfg.patch_dim), np.float32)
    padded[: len(pixels)] = pixels
    out["pixel_values"].append(padded)
    ids = np.zeros((1, length), np.int64)
    n = min(len(traj.token_ids), length)
    ids[0, :n] = np.asarray(traj.token_ids)[:n]
    mask = (np.arange(length) < n)[None]
    out["mrope_positions"].append(mrope_positions(ids, grids, model_cfg, mask)[0][:, 0])
  return {k: np.stack(v).astype(np.float32 if k == "pixel_values" else np.int32) for k, v in out.items()}
