"""The AOT tool's step batches (rl/scale/aot_programs.py): a run's padded rollout arrays as abstract values, with
what a row carries beyond its tokens: a mixture of experts' sampler routes, a vision-language policy's images.

    n_rows, arrays = abstract_step_arrays(run)     # what `prepare` takes, as stages.step_arrays makes it
    images = row_images(spec, cfg, "3x160x210")    # 3 images of 160 x 210 pixels a row (None: a text-only model)

A row's images go through the policy's own image processor (its resize bounds: `model.vision`, else transformers'
defaults), so the patches a row holds are those a real image of that size gives; the arrays are the ones
rl/vision_batch.image_arrays makes for the train step (pixel values padded to `model.vision.patch_multiple`, the
row's vision layout, M-RoPE positions).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

# The GUI task's screenshot (envservers/envs/miniwob_env.py TASK_BOX: MiniWoB++'s task area, width x height)
GUI_SCREENSHOT = (160, 210)


@dataclasses.dataclass(frozen=True)
class RowImages:
  """One row's images: their count, size (width x height, pixels), grids int[N, 3] and padded patch count."""

  count: int
  width: int
  height: int
  grids: np.ndarray
  num_patches: int
  merge: int = 2  # the tower's spatial_merge_size: merge**2 patches make one image token

  @property
  def tokens(self) -> int:
    """Image-pad tokens the row's images take in its sequence (merged patches)."""
    return int(np.prod(self.grids, axis=1).sum()) // self.merge**2

  def note(self) -> str:
    """The shape column's note: `, + 3 images of 160x210 (768 patches, 192 tokens) a row`."""
    return (
      f", + {self.count} image{'s' * (self.count != 1)} of {self.width}x{self.height} ({self.num_patches} patches, "
      f"{self.tokens} tokens) a row"
    )


def parse_images(text: str, default_count: int) -> tuple[int, int, int]:
  """(count, width, height) of `--images` ("COUNTxWIDTHxHEIGHT"; "" = `default_count` GUI screenshots)."""
  if not text:
    return (default_count, *GUI_SCREENSHOT)
  m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text.strip())
  if m is None or min(int(g) for g in m.groups()) < 1:
    raise ValueError(f"--images={text!r}: give COUNTxWIDTHxHEIGHT with each >= 1, e.g. 3x160x210")
  return tuple(int(g) for g in m.groups())


def row_images(spec, cfg, images: str = "", seq_len: int = 0) -> RowImages | None:
  """The images of one training row of the run `spec` (rl.spec.RunSpec) for the model config `cfg`: `images`
  (parse_images; default one GUI screenshot a turn, rollout.max_turns of them); None for a text-only model.
  ValueError when their image tokens do not fit a row of `seq_len` tokens (0: not checked)."""
  if cfg.vision is None:
    if images:
      raise ValueError(f"--images={images!r}: model_type {cfg.model_type!r} has no vision tower")
    return None
  from PIL import Image

  from agentfly_jax.rl.batching import bucket
  from agentfly_jax.vision.processor import VisionProcessor

  count, width, height = parse_images(images, spec.rollout.max_turns)
  v = spec.model.vision
  bounds = {k: getattr(v, k) for k in ("min_pixels", "max_pixels") if getattr(v, k)}
  processor = VisionProcessor.for_model(cfg.vision, **bounds)
  _, grids = processor.process([Image.new("RGB", (width, height))] * count)
  merge = cfg.vision.spatial_merge_size
  patches = int(np.prod(grids, axis=1).sum())
  row = RowImages(count, width, height, grids, bucket(patches, v.patch_multiple), merge)
  if seq_len and row.tokens >= seq_len:
    raise ValueError(
      f"--images={images or f'{count}x{width}x{height}'!r}: the row's images take {row.tokens} image tokens, a row "
      f"holds {seq_len} (raise --seq_len or give fewer / smaller images)"
    )
  return row


def image_arrays(images: RowImages, vcfg, n_rows: int, seq_len: int, sharding) -> dict:
  """The abstract image arrays of `n_rows` rows (rl/core/vision.py VISION_KEYS), rows split by `sharding`."""
  import jax
  import jax.numpy as jnp

  from agentfly_jax.models.vision import padded_layout
  from agentfly_jax.rl.core.vision import LAYOUT_KEYS

  layout, _ = padded_layout(images.grids, images.num_patches, vcfg)
  sds = lambda shape, dtype: jax.ShapeDtypeStruct((n_rows, *shape), dtype, sharding=sharding)
  arrays = {f"vision_{k}": sds(np.shape(getattr(layout, k)), jnp.int32) for k in LAYOUT_KEYS}
  arrays["pixel_values"] = sds((images.num_patches, vcfg.patch_dim), jnp.float32)
  arrays["mrope_positions"] = sds((3, seq_len), jnp.int32)
  return arrays


def route_key(run) -> str | None:
  """The name a mixture-of-experts policy's sampler routes int32[rows, seq_len, Lm, k] have in a step's arrays
  (rl/update.py put_arrays): "routed_experts" under `model.router_replay=rollout` (prepare and the train step route
  by them), else "rollout_experts" (only measured, router/rollout_mismatch); None for a dense model or a sampler
  that records no routes."""
  from agentfly_jax.rl.spec import ROUTING_SAMPLERS

  if not run.cfg.is_moe or run.spec.rollout.sampler not in ROUTING_SAMPLERS:
    return None
  return "routed_experts" if run.spec.model.router_replay == "rollout" else "rollout_experts"


def batch_note(run) -> str:
  """The shape column's note of what a row carries beyond its tokens: images, sampler routes ("" for neither)."""
  key = route_key(run)
  images = "" if run.images is None else run.images.note()
  routes = "" if key is None else f", + {key} [{len(run.cfg.moe_layers)} x {run.cfg.num_experts_per_tok}] a token"
  return images + routes


def abstract_step_arrays(run) -> tuple[int, dict]:
  """(rows, a step's padded arrays, as stages.step_arrays makes them for `prepare`): rows_per_step x num_chains rows
  rounded up to a multiple of fsdp, [rows, seq_len] (rewards, group_ids: [rows]), split over fsdp; a
  mixture-of-experts policy's sampler routes [rows, seq_len, Lm, k] too (`route_key`), a vision-language policy's
  images (`run.images`, `row_images`). `run`: an aot_programs.AbstractRun."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  _sds = lambda shape, dtype, sharding: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
  r, seq_len = run.spec.rollout, run.seq_len
  rows_sh = NamedSharding(run.mesh, P("fsdp"))
  n_rows = -(-r.rows_per_step * r.num_chains // run.fsdp) * run.fsdp
  arrays = {
    "input_ids": _sds((n_rows, seq_len), jnp.int32, rows_sh),
    "target_ids": _sds((n_rows, seq_len), jnp.int32, rows_sh),
    "attention_mask": _sds((n_rows, seq_len), jnp.bool_, rows_sh),
    "action_mask": _sds((n_rows, seq_len), jnp.bool_, rows_sh),
    "sampler_logprobs": _sds((n_rows, seq_len), jnp.float32, rows_sh),
    "rewards": _sds((n_rows,), jnp.float32, rows_sh),
    "group_ids": _sds((n_rows,), jnp.int32, rows_sh),
  }
  key = route_key(run)
  if key is not None:
    shape = (n_rows, seq_len, len(run.cfg.moe_layers), run.cfg.num_experts_per_tok)
    arrays[key] = _sds(shape, jnp.int32, rows_sh)
  if run.images is not None:
    arrays.update(image_arrays(run.images, run.cfg.vision, n_rows, seq_len, rows_sh))
  return n_rows, arrays
