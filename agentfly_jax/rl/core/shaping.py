"""Reward shaping applied inside the jitted prepare pass (works on numpy and jnp arrays alike)."""

from __future__ import annotations

import numpy as np


def overlong_penalty(num_generated, *, max_tokens: int, buffer: int, factor: float):
  """DAPO soft overlong punishment, counted in generated tokens: 0 up to max-buffer, then linear
  down to -factor at max_tokens (and below past it). num_generated: int[B] (numpy or jnp) ->
  f32[B] of the same kind."""
  num_generated = num_generated.astype(np.float32)
  if buffer <= 0:
    return num_generated * 0.0
  over = num_generated - (max_tokens - buffer)
  return -over.clip(0, None) / buffer * factor
