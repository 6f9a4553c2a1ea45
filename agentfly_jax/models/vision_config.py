"""VisionConfig: the Qwen2.5-VL vision tower's architecture, with HF `vision_config` field names.

    vcfg = VisionConfig.from_hf_dict(hf["vision_config"])
    vcfg.to_hf_dict()                    # -> the dict HF's Qwen2_5_VLVisionConfig reads back

It is the `vision` field of a `ModelConfig` of model_type "qwen2_5_vl" (models/config.py).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """Attributes (HF names): depth (vision blocks), hidden_size, intermediate_size (the gated MLP's
  width), num_heads, in_channels, patch_size, temporal_patch_size (a patch is temporal x patch x
  patch pixels of in_channels), spatial_merge_size (m: m x m patches merge into one LM token),
  window_size (pixels: a window is window_size / patch_size patches a side), fullatt_block_indexes
  (blocks with full attention per image frame; the others attend within a window), out_hidden_size
  (the merger's output: the LM's hidden_size), rope_theta (the 2-D rotary base), tokens_per_second
  (videos only, kept for the HF config), hidden_act ('silu'), initializer_range."""

  depth: int = 32
  hidden_size: int = 1280
  intermediate_size: int = 3420
  num_heads: int = 16
  in_channels: int = 3
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  window_size: int = 112
  fullatt_block_indexes: tuple = (7, 15, 23, 31)
  out_hidden_size: int = 3584
  rope_theta: float = 10000.0
  tokens_per_second: int = 2
  hidden_act: str = "silu"
  initializer_range: float = 0.02

  def __post_init__(self):
    object.__setattr__(self, "fullatt_block_indexes", tuple(self.fullatt_block_indexes))
    self.validate()

  def validate(self) -> None:
    """Raises ValueError naming the bad field."""
    for name in (
      "depth",
      "hidden_size",
      "intermediate_size",
      "num_heads",
      "in_channels",
      "patch_size",
      "temporal_patch_size",
      "spatial_merge_size",
      "window_size",
      "out_hidden_size",
    ):
      value = getattr(self, name)
      if not (isinstance(value, int) and value >= 1):
        raise ValueError(f"VisionConfig.{name} must be an int >= 1, got {value!r}")
    if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
      raise ValueError(
        f"VisionConfig.hidden_size ({self.hidden_size}) / num_heads ({self.num_heads}) must be a multiple of 4 "
        "(the 2-D rotary splits each head's dims into height and width halves)"
      )
    if self.window_size % (self.patch_size * self.spatial_merge_size):
      raise ValueError(
        f"VisionConfig.window_size ({self.window_size}) must be a multiple of patch_size * spatial_merge_size "
        f"({self.patch_size * self.spatial_merge_size})"
      )
    bad = [i for i in self.fullatt_block_indexes if not (isinstance(i, int) and 0 <= i < self.depth)]
    if bad:
      raise ValueError(f"VisionConfig.fullatt_block_indexes {bad} are not block indices in [0, {self.depth})")
    if self.hidden_act != "silu":
      raise ValueError(f"VisionConfig.hidden_act {self.hidden_act!r} is not supported; only 'silu'")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """Pixels of one patch (a row of pixel_values): in_channels * temporal_patch_size * patch_size**2."""
    return self.in_channels * self.temporal_patch_size * self.patch_size**2

  @property
  def window_merged(self) -> int:
    """A window's side in merged tokens."""
    return self.window_size // self.spatial_merge_size // self.patch_size

  @classmethod
  def from_hf_dict(cls, hf: dict, *, source: str = "vision_config") -> "VisionConfig":
    """From HF's `vision_config` dict; ValueError naming `source` and the field."""
    if not isinstance(hf, dict):
      raise ValueError(f"{source}: expected a JSON object, got {type(hf).__name__}")
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in hf.items() if k in fields}
    if "in_channels" not in kwargs and "in_chans" in hf:  # transformers 4.x name
      kwargs["in_channels"] = hf["in_chans"]
    if "num_heads" not in kwargs and "num_attention_heads" in hf:
      kwargs["num_heads"] = hf["num_attention_heads"]
    rope = hf.get("rope_parameters") or {}
    if "rope_theta" in rope:
      kwargs["rope_theta"] = rope["rope_theta"]
    for name in ("patch_size", "temporal_patch_size"):
      if isinstance(kwargs.get(name), (list, tuple)):
        sizes = set(kwargs[name])
        if len(sizes) != 1:
          raise ValueError(f"{source}: {name}={kwargs[name]} (non-square) is not supported")
        kwargs[name] = sizes.pop()
    try:
      return cls(**kwargs)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{source}: {e}") from e

  def to_hf_dict(self) -> dict:
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "rope_theta"}
    out["fullatt_block_indexes"] = list(self.fullatt_block_indexes)
    out["model_type"] = "qwen2_5_vl_vision"
    out["rope_parameters"] = {"rope_type": "axial", "rope_theta": self.rope_theta}
    return out

  def replace(self, **changes) -> "VisionConfig":
    return dataclasses.replace(self, **changes)


_TOKEN_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def flat_vl_hf_dict(hf: dict, *, source: str = "config.json") -> dict:
  """An HF Qwen2.5-VL config.json (transformers 5: text fields under `text_config`; 4.x: at the top)
  as one flat dict of ModelConfig fields: the text model's, `vision` (a VisionConfig), `mrope_section`
  and the special token ids; the rope parameters without mrope_section (rope_type "mrope" is "default")."""
  text = hf.get("text_config")
  flat = {k: v for k, v in hf.items() if k not in ("text_config", "vision_config")}
  if isinstance(text, dict):
    flat.update({k: v for k, v in text.items() if k not in ("model_type", "tie_word_embeddings")})
  flat["model_type"] = "qwen2_5_vl"
  if "vision_config" not in hf:
    raise ValueError(f"{source}: model_type 'qwen2_5_vl' needs a vision_config")
  flat["vision"] = VisionConfig.from_hf_dict(hf["vision_config"], source=f"{source}: vision_config")
  for key in ("rope_parameters", "rope_scaling"):
    rope = flat.get(key)
    if isinstance(rope, dict):
      rope = dict(rope)
      if "mrope_section" in rope:
        flat["mrope_section"] = tuple(rope.pop("mrope_section"))
      if rope.get("rope_type", rope.get("type")) == "mrope":
        rope.pop("type", None)
        rope["rope_type"] = "default"
      flat[key] = rope
  if "mrope_section" not in flat:
    raise ValueError(f"{source}: qwen2_5_vl rope_parameters has no mrope_section")
  return flat


def nest_vl_hf_dict(flat: dict, cfg) -> dict:
  """The text model's flat HF dict (ModelConfig.to_hf_dict's) nested as HF's Qwen2.5-VL config.json:
  text fields under `text_config` (mrope_section in its rope_parameters), `vision_config`, token ids."""
  top_keys = ("architectures", "model_type", "tie_word_embeddings", "dtype")
  text = {k: v for k, v in flat.items() if k not in top_keys and k != "rope_scaling"}
  text["model_type"] = "qwen2_5_vl_text"
  text["rope_parameters"] = dict(text["rope_parameters"], mrope_section=list(cfg.mrope_section))
  out = {k: flat[k] for k in top_keys if k in flat}
  out.update(text_config=text, vision_config=cfg.vision.to_hf_dict())
  out.update({k: getattr(cfg, k) for k in _TOKEN_IDS})
  return out
