"""`image_probe`: an env type for the protocol's image checks; it returns good and bad image observations.

reset(row) returns a text part and one small RGB image of `row["color"]` (default [200, 30, 30]), or the
observation `row["kind"]` names (below). A step's
action names the observation the env returns (reward 1.0, done false, so a test sees what the server
keeps of a bad step):
  "ok"        text + a 32x24 image of the row's colour
  "bomb"      a PNG whose header declares 6000 x 6000 pixels (a decompression bomb; its data is tiny)
  "oversize"  a data URL of 100 MB (over the image byte limit)
  "frame:N"   two valid noise PNGs of N x N pixels each (with a small --max-frame-bytes: over the frame)
  "mode"      a 16-bit grayscale PNG (mode I;16)
  "truncated" a PNG cut in half
  "garbage"   base64 of bytes that are no image
  "bad_part"  a part of an unknown type; "not_a_list" a dict instead of a list
"""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

import numpy as np
from PIL import Image

from envservers import images
from envservers.env import ServerEnv, StepOutcome
from envservers.registry import register_env


def _url(data: bytes, media: str = "image/png") -> dict[str, Any]:
  return {"type": "image_url", "image_url": {"url": f"data:{media};base64," + base64.b64encode(data).decode("ascii")}}


def bomb_png(width: int = 6000, height: int = 6000) -> bytes:
  """A 1x1 PNG whose IHDR is rewritten to declare `width` x `height` (CRC fixed, so it parses)."""
  data = bytearray(images.png_bytes(np.zeros((1, 1), np.uint8)))
  start = 8 + 8  # signature, then the IHDR chunk's length and type
  data[start : start + 8] = struct.pack(">II", width, height)
  crc = zlib.crc32(bytes(data[start - 4 : start + 13]))
  data[start + 13 : start + 17] = struct.pack(">I", crc)
  return bytes(data)


def mode_i16_png() -> bytes:
  out = io.BytesIO()
  Image.fromarray(np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000).save(out, format="PNG")
  return out.getvalue()


def probe_observation(kind: str, color: list[int]) -> Any:
  """The observation `kind` names (module docstring); ValueError for an unknown kind."""
  text = images.text_part(f"probe: {kind}")
  if kind == "ok":
    return [text, images.image_part(np.full((24, 32, 3), color, np.uint8))]
  if kind == "bomb":
    return [text, _url(bomb_png())]
  if kind == "oversize":
    return [text, {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000_000}}]
  if kind.startswith("frame:"):
    side = int(kind.split(":", 1)[1])
    rng = np.random.default_rng(side)
    return [text, *(images.image_part(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(2))]
  if kind == "mode":
    return [text, _url(mode_i16_png())]
  if kind == "truncated":
    whole = images.png_bytes(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    return [text, _url(whole[: len(whole) // 2])]
  if kind == "garbage":
    return [text, _url(b"this is not an image at all" * 10)]
  if kind == "bad_part":
    return [text, {"type": "video", "video": "x"}]
  if kind == "not_a_list":
    return {"type": "text", "text": "a part, not a list"}
  raise ValueError(f"image_probe: unknown action {kind!r}")


@register_env
class ImageProbeEnv(ServerEnv):
  name = "image_probe"

  def __init__(self):
    self.color = [200, 30, 30]

  async def reset(self, row: dict | None):
    self.color = list((row or {}).get("color", [200, 30, 30]))
    return probe_observation(str((row or {}).get("kind", "ok")), self.color)

  async def step(self, action: Any) -> StepOutcome:
    if not isinstance(action, str):
      return StepOutcome(f"Error: the action is a kind name, got {type(action).__name__}", info={"error": "BadAction"})
    try:
      return StepOutcome(probe_observation(action, self.color), reward=1.0)
    except ValueError as e:
      return StepOutcome(f"Error: {e}", info={"error": "BadAction"})
