"""Qwen2.5-VL: the Qwen2 causal LM (causal_lm.py) with a vision tower (vision.py) and M-RoPE positions.

    model = Qwen25VL(tiny_config("qwen2_5_vl"), rngs=nnx.Rngs(0))      # or hf_io.from_pretrained(folder)
    logits = model(input_ids, pixel_values=pixel_values, image_grid_thw=grid)   # eager: layout and positions here
    positions, deltas = mrope_positions(input_ids, grid, model.config)       # host, for a jitted call:
    layout = vision_layout(grid, model.config.vision)
    logits = jax.jit(lambda m, *a: m(a[0], positions=a[1], pixel_values=a[2], vision_layout=a[3]))(model, ...)

HF's module tree and names (`model.*` the language model, `visual.*` the tower, `lm_head`), so
hf_io.py's name table loads and saves it as for the text models. Each image-pad token
(config.image_token_id) of input_ids takes, in order through the batch row by row, the next merged
image feature (HF's masked_scatter); the images' features come in image_grid_thw's order. Positions
are [3, B, T] (temporal, height, width; `mrope_positions`, HF's get_rope_index): text tokens count on
from the largest position before them. A decode step after a prefill uses positions [B, T]
= its index + the row's `deltas` (all three axes agree for text tokens).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentfly_jax.models.causal_lm import CausalLM, Critic, embed_lookup
from agentfly_jax.models.config import ModelConfig
from agentfly_jax.models.vision import VisionLayout, VisionTower, check_grids, vision_layout


def image_token_counts(image_grid_thw, cfg: ModelConfig) -> np.ndarray:
  """int64[I]: the LM tokens each image takes, t * (h / m) * (w / m)."""
  grid = check_grids(_host_grid(image_grid_thw), cfg.vision)
  m = cfg.vision.spatial_merge_size
  return grid[:, 0] * (grid[:, 1] // m) * (grid[:, 2] // m)


def _row_positions(ids: np.ndarray, grids, start_image: int, cfg: ModelConfig, row: int):
  """M-RoPE positions int64[3, n] of one row's real tokens `ids` [n] whose images are grids[start_image:];
  returns (positions, the number of images used)."""
  m, image = cfg.vision.spatial_merge_size, start_image
  out, pos, i = [], 0, 0
  is_image = ids == cfg.image_token_id
  while i < len(ids):
    if not is_image[i]:
      j = i + int(np.argmax(is_image[i:])) if is_image[i:].any() else len(ids)
      out.append(np.broadcast_to(pos + np.arange(j - i), (3, j - i)))
      pos, i = pos + j - i, j
      continue
    if image >= len(grids):
      raise ValueError(
        f"input_ids row {row} has more image tokens (image_token_id {cfg.image_token_id}) than the "
        f"{len(grids)} images of image_grid_thw take"
      )
    t, h, w = (int(x) for x in grids[image])
    lt, lh, lw = t, h // m, w // m
    n = lt * lh * lw
    if i + n > len(ids) or not is_image[i : i + n].all():
      raise ValueError(
        f"input_ids row {row}: image {image} (grid {(t, h, w)}) takes {n} image tokens from token {i}, "
        f"but only {int(np.argmin(np.append(is_image[i:], False)))} image tokens follow there"
      )
    tt, hh, ww = np.meshgrid(np.arange(lt), np.arange(lh), np.arange(lw), indexing="ij")
    out.append(np.stack([tt, hh, ww]).reshape(3, -1) + pos)
    pos, i, image = pos + max(lh, lw), i + n, image + 1
  return (np.concatenate(out, axis=1) if out else np.zeros((3, 0), np.int64)), image - start_image


def mrope_positions(input_ids, image_grid_thw, cfg: ModelConfig, attention_mask=None):
  """HF's get_rope_index for images: (positions int32[3, B, T], deltas int32[B]), on the host.

  input_ids int[B, T]; image_grid_thw int[I, 3] the images in order through the batch (row by row);
  attention_mask bool[B, T] (True = real token; padding gets position 0 and is skipped). An image's
  t * (h/m) * (w/m) tokens take (temporal, row, column) + the position reached before it; the text
  after it continues from that position + max(h, w) / m. deltas: max position + 1 - real tokens
  (a decode step's positions are its index + delta). ValueError when the image tokens and the grids
  disagree (more or fewer image tokens than the grids take)."""
  ids = np.asarray(input_ids)
  if ids.ndim != 2:
    raise ValueError(f"input_ids must be [B, T], got shape {ids.shape}")
  grids = check_grids(np.zeros((0, 3), np.int64) if image_grid_thw is None else image_grid_thw, cfg.vision)
  mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
  positions = np.zeros((3,) + ids.shape, np.int64)
  deltas = np.zeros(ids.shape[0], np.int64)
  used = 0
  for b in range(ids.shape[0]):
    row, n = _row_positions(ids[b][mask[b]], grids, used, cfg, b)
    used += n
    positions[:, b, mask[b]] = row
    deltas[b] = (row.max() + 1 if row.size else 0) - row.shape[1]
  if used != len(grids):
    raise ValueError(f"image_grid_thw has {len(grids)} images but input_ids' image tokens take only {used}")
  return positions.astype(np.int32), deltas.astype(np.int32)


def scatter_image_features(embeds: jax.Array, input_ids: jax.Array, features: jax.Array, image_token_id: int):
  """embeds [B, T, D] with each image token's row (input_ids == image_token_id, row-major) replaced by
  the next row of features [M, D]; M must equal the number of image tokens (checked by the callers).
  Per-row features [B, Mr, D]: row b's image tokens take row b's features in order (features past a
  row's image tokens, a padded image's, are never taken)."""
  b, t, d = embeds.shape
  is_image = input_ids == image_token_id
  if features.ndim == 3:
    take = jnp.clip(jnp.cumsum(is_image, axis=1) - 1, 0, features.shape[1] - 1)
    rows = jnp.take_along_axis(features, take[..., None], axis=1).astype(embeds.dtype)
    return jnp.where(is_image[..., None], rows, embeds)
  take = jnp.clip(jnp.cumsum(is_image.reshape(-1)) - 1, 0, features.shape[0] - 1)
  rows = features[take].reshape(b, t, d).astype(embeds.dtype)
  return jnp.where(is_image[..., None], rows, embeds)


def model_class(cfg: ModelConfig, *, critic: bool = False) -> type:
  """The class a config builds: Critic (a value model), Qwen25VL (a config with a vision tower) or CausalLM."""
  return Critic if critic else (Qwen25VL if cfg.vision is not None else CausalLM)


class Qwen25VL(CausalLM):
  """HF Qwen2_5_VLForConditionalGeneration: CausalLM (`model`, `lm_head`) + `visual` (VisionTower)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    if cfg.vision is None:
      raise ValueError(f"Qwen25VL needs a config with a vision tower (model_type 'qwen2_5_vl'), got {cfg.model_type!r}")
    super().__init__(cfg, rngs=rngs)
    self.visual = VisionTower(cfg, rngs=rngs)

  def image_features(self, pixel_values, image_grid_thw=None, *, vision_layout: VisionLayout | None = None):
    """pixel_values [N, patch_dim] -> merged features [N / m^2, D] of the images of image_grid_thw
    (or of their precomputed `vision_layout`)."""
    layout = vision_layout if vision_layout is not None else _layout(image_grid_thw, self.config)
    pixel_values = jnp.asarray(pixel_values)
    if pixel_values.ndim == 3:  # per-row images [B, P, patch_dim], each row's layout [B, ...]
      return jax.vmap(self.visual)(pixel_values, VisionLayout(*(jnp.asarray(a) for a in layout)))
    return self.visual(pixel_values, layout)

  def hidden_states(
    self,
    input_ids,
    *,
    pixel_values=None,
    image_grid_thw=None,
    vision_layout=None,
    positions=None,
    image_embeds=None,
    image_mask=None,
    **kwargs,
  ):
    """CausalLM.hidden_states with images: `pixel_values` [N, patch_dim] and `image_grid_thw` int[I, 3]
    (host values), or for a jitted call `vision_layout` (vision.vision_layout) and `positions` [3, B, T]
    (`mrope_positions`) in place of the grids. Per-row images (the train batch, rl/vision_batch.py):
    `pixel_values` [B, P, patch_dim] and a `vision_layout` of [B, ...] arrays, each row's own.
    Without images, a text-only forward (positions [B, T]).
    Or features computed before (`image_features`, the paged engine's chunks): `image_embeds` [B, T, D] taken
    where `image_mask` bool[B, T] is True, in place of the token embeddings (positions [3, B, T] given)."""
    cfg = self.config
    embeds = None
    if image_embeds is not None:
      if pixel_values is not None or image_mask is None:
        raise ValueError("image_embeds need image_mask and no pixel_values")
      tokens = embed_lookup(self.model.embed_tokens, input_ids, cfg.compute_dtype)
      embeds = jnp.where(image_mask[..., None], image_embeds.astype(tokens.dtype), tokens)
    elif pixel_values is not None:
      if image_grid_thw is None and vision_layout is None:
        raise ValueError("pixel_values need image_grid_thw (or a vision_layout) to say each image's grid")
      if image_grid_thw is not None:
        _check_image_tokens(input_ids, int(image_token_counts(image_grid_thw, cfg).sum()), cfg)
      elif np.ndim(pixel_values) == 3:  # per-row images: padded images' features are never taken
        pass
      else:
        _check_image_tokens(input_ids, vision_layout.window_index.shape[0], cfg)
      features = self.image_features(pixel_values, image_grid_thw, vision_layout=vision_layout)
      embeds = scatter_image_features(
        embed_lookup(self.model.embed_tokens, input_ids, cfg.compute_dtype), input_ids, features, cfg.image_token_id
      )
    elif image_grid_thw is not None or vision_layout is not None:
      raise ValueError("image_grid_thw / vision_layout were given without pixel_values")
    if positions is None and pixel_values is not None:
      if image_grid_thw is None or isinstance(input_ids, jax.core.Tracer):
        raise ValueError(
          "a forward with images under jit needs positions [3, B, T] (models.qwen25_vl.mrope_positions on the host)"
        )
      if kwargs.get("cache") is not None:
        raise ValueError("a cached forward with images needs positions [3, B, T] (models.qwen25_vl.mrope_positions)")
      positions, _ = mrope_positions(input_ids, image_grid_thw, cfg, kwargs.get("attention_mask"))
    if positions is not None:
      positions = jnp.asarray(positions)
    with_router = kwargs.pop("with_router", False)
    args = {k: kwargs.pop(k, None) for k in ("attention_mask", "cache", "cache_index", "segment_ids", "pages")}
    routed = kwargs.pop("routed_experts", None)
    from_empty = kwargs.pop("from_empty_cache", False)
    if kwargs:
      raise TypeError(f"hidden_states got unexpected arguments {sorted(kwargs)}")
    x, new_cache, routes = self._hidden_states(
      input_ids,
      positions,
      args["attention_mask"],
      args["cache"],
      args["cache_index"],
      args["segment_ids"],
      from_empty,
      args["pages"],
      routed,
      inputs_embeds=embeds,
    )
    return (x, new_cache, routes) if with_router else (x, new_cache)

  def __call__(self, input_ids, *, pixel_values=None, image_grid_thw=None, vision_layout=None, cache=None, **kwargs):
    """CausalLM.__call__ with images (see `hidden_states`): logits float32[B, T, V]; with a cache,
    (logits, new_cache)."""
    hidden, new_cache = self.hidden_states(
      input_ids,
      pixel_values=pixel_values,
      image_grid_thw=image_grid_thw,
      vision_layout=vision_layout,
      cache=cache,
      **kwargs,
    )
    logits = self.logits_from_hidden(hidden)
    return logits if cache is None else (logits, new_cache)


def _layout(image_grid_thw, cfg: ModelConfig) -> VisionLayout:
  if image_grid_thw is None:
    raise ValueError("image_features needs image_grid_thw or a vision_layout")
  return vision_layout(_host_grid(image_grid_thw), cfg.vision)


def _host_grid(image_grid_thw) -> np.ndarray:
  if isinstance(image_grid_thw, jax.core.Tracer):
    raise ValueError("image_grid_thw must be a host value (a traced grid cannot shape the layout): pass vision_layout")
  return np.asarray(image_grid_thw)


def _check_image_tokens(input_ids, num_features: int, cfg: ModelConfig) -> None:
  """ValueError when concrete input_ids hold another number of image tokens than there are features."""
  if isinstance(input_ids, jax.core.Tracer):
    return
  n = int(np.sum(np.asarray(input_ids) == cfg.image_token_id))
  if n != num_features:
    raise ValueError(
      f"input_ids hold {n} image tokens (image_token_id {cfg.image_token_id}) but the images of "
      f"image_grid_thw give {num_features} features"
    )
