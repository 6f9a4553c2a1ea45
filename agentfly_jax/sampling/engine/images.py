"""A request's images in the paged engine: host-side layout of its image tokens, positions and page keys.

    req = image_request(prompt_ids, PromptImages(pixel_values, image_grid_thw), model.config, "request 0")
    keys = req.keys                      # prompt ids with each image's pad tokens replaced by the image's digest
    rope = req.rope_positions(0, 40)     # int32[3, 40]: M-RoPE positions of tokens [0, 40) (decode: index + delta)
    embeds, mask = req.chunk_embeds(features, 8, 32)   # features of tokens [8, 40) that are image pads

The vision tower runs once per request (programs.image_features) on its pixel values; its merged features
[M, D] (one row per image-pad token, in prompt order) are kept on the host, so a prefill chunk takes the rows
of the pad tokens it holds: a chunk boundary may fall anywhere inside an image. Positions are HF's
get_rope_index (models/qwen25_vl.mrope_positions) for the prompt; every token after it (the reply, and the
reply's keys / values recomputed after a preemption) takes text positions = token index + delta, as HF's
generate does. Prefix sharing (pages.py) keys a page by `keys`: an image's pad tokens by its pixels' digest,
so two prompts with the same text and different images never share the pages from the first image on.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agentfly_jax.sampling.protocol import PromptImages


@dataclasses.dataclass(frozen=True, eq=False)
class ImageRequest:
  """One prompt's images, laid out (see the module docstring).

  Attributes:
    images: the request's PromptImages.
    prompt_rope: int32[3, n] M-RoPE positions of the n prompt tokens.
    delta: int, a later token's text position minus its index.
    feature_rows: int32[n], the features row of each prompt token (-1: not an image-pad token).
    keys: tuple of n page keys (ints for text tokens, an image's digest for its pad tokens).
  """

  images: PromptImages
  prompt_rope: np.ndarray
  delta: int
  feature_rows: np.ndarray
  keys: tuple

  def rope_positions(self, start: int, n: int) -> np.ndarray:
    """int32[3, n]: the positions of tokens [start, start + n) (past the prompt: index + delta on all three)."""
    p = self.prompt_rope.shape[1]
    head = self.prompt_rope[:, start : min(start + n, p)]
    tail = np.arange(max(start, p), start + n, dtype=np.int32) + self.delta
    return np.concatenate([head, np.broadcast_to(tail, (3, tail.size))], axis=1).astype(np.int32)

  def chunk_embeds(self, features: np.ndarray, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(embeds float[n, D], mask bool[n]): the features of tokens [start, start + n) that are image pads."""
    rows = np.full((n,), -1, np.int32)
    part = self.feature_rows[start : start + n]
    rows[: part.size] = part
    mask = rows >= 0
    embeds = np.zeros((n, features.shape[1]), features.dtype)
    embeds[mask] = features[rows[mask]]
    return embeds, mask


def image_request(prompt, images: PromptImages, cfg, label: str) -> ImageRequest:
  """The layout of `images` in `prompt` (int ids) for a model config with a vision tower; ValueError naming
  `label` when the model is text-only, the pixels' patch size is not the tower's, or the prompt's image-pad
  tokens and the grids disagree."""
  from agentfly_jax.models.qwen25_vl import image_token_counts, mrope_positions

  if not isinstance(images, PromptImages):
    raise ValueError(f"{label}: images must be a PromptImages (pixel_values, image_grid_thw), got {type(images)}")
  if cfg.vision is None:
    raise ValueError(
      f"{label}: the request has images but the sampler's model (model_type {cfg.model_type!r}) is text-only; "
      "images need a vision-language model (qwen2_5_vl)"
    )
  v = cfg.vision
  patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size**2
  if images.pixel_values.shape[1] != patch_dim:
    raise ValueError(
      f"{label}: PromptImages.pixel_values rows have {images.pixel_values.shape[1]} values; the model's vision "
      f"tower takes patches of {patch_dim} (in_channels x temporal_patch_size x patch_size^2)"
    )
  ids = np.asarray(prompt, np.int64)
  try:
    rope, deltas = mrope_positions(ids[None], images.image_grid_thw, cfg)
  except ValueError as e:
    raise ValueError(f"{label}: the prompt's image tokens and PromptImages.image_grid_thw disagree: {e}") from None
  is_image = ids == cfg.image_token_id
  keys = ids.tolist()
  counts = image_token_counts(images.image_grid_thw, cfg)
  where = np.flatnonzero(is_image)
  start = 0
  for digest, count in zip(images.digests(), counts.tolist()):
    for i in where[start : start + count]:
      keys[i] = digest
    start += count
  rows = np.where(is_image, np.cumsum(is_image) - 1, -1).astype(np.int32)
  return ImageRequest(images, rope[:, 0], int(deltas[0]), rows, tuple(keys))
