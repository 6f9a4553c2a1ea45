"""A vision-language policy's per-row image arrays in a batch -> the Qwen25VL forward's image arguments.

The batch keys (rl/vision_batch.py builds them on the host): pixel_values f32[B, P, patch_dim],
mrope_positions int32[B, 3, L], and each row's VisionLayout (models/vision.py) as vision_<field>
[B, ...]. Rows first, so selecting rows (micro-batches, chunks, padding rows) carries a row's images.
"""

from __future__ import annotations

LAYOUT_KEYS = ("window_index", "reverse_index", "full_segments", "window_segments", "rotary_positions")
VISION_KEYS = ("pixel_values", "mrope_positions") + tuple(f"vision_{k}" for k in LAYOUT_KEYS)


def vision_keys(batch: dict) -> tuple:
  """The image keys `batch` holds: VISION_KEYS for a vision batch, () for a text-only one."""
  return VISION_KEYS if "pixel_values" in batch else ()


def vision_inputs(batch: dict) -> dict:
  """{"pixel_values" [B, P, patch_dim], "vision_layout" (per-row VisionLayout of [B, ...] arrays),
  "positions" int32[3, B, L]} of a batch with VISION_KEYS; {} for a text-only batch. numpy or jnp."""
  if "pixel_values" not in batch:
    return {}
  from agentfly_jax.models.vision import VisionLayout

  layout = VisionLayout(*(batch[f"vision_{k}"] for k in LAYOUT_KEYS))
  return {
    "pixel_values": batch["pixel_values"],
    "vision_layout": layout,
    "positions": batch["mrope_positions"].swapaxes(0, 1),
  }
