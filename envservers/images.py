"""Observations that carry images: the part shape, builders, and the bounded check the server runs.

An observation (from `reset` and `step`) is a str or a list of parts (PROTOCOL.md, "Observations"):

    [{"type": "text", "text": "Click the button."},
     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR..."}}]

    obs = [text_part("How many circles?"), image_part(pil_image)]   # or a uint8 array, or PNG bytes
    check_observation(obs)                                         # ObservationError naming what is wrong

`check_observation` bounds what one image may cost before it decodes anything: the base64 length
gives the byte size (over `max_image_bytes`: refused before base64 decoding), the PNG / JPEG header
gives the pixel count (over `max_pixels`: refused before pixel decoding, so a decompression bomb
never inflates) and the mode; then the pixels are decoded once so truncated or corrupt data is
refused too. Only Pillow is used (no agentfly_jax, no JAX).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import warnings
from typing import Any

from PIL import Image

MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG"}
ALLOWED_MODES = ("RGB", "RGBA", "L")


class ObservationError(ValueError):
  """An observation that is not a str or a list of valid parts; the message names the part and field."""


@dataclasses.dataclass(frozen=True)
class ImageLimits:
  """What one observation may carry (PROTOCOL.md, "Observations").

  max_pixels: width x height of one image, read from its header before decoding (4096 x 4096).
  max_image_bytes: encoded bytes of one image (6,000,000: its base64 data URL stays under the
    decoding limit of 8 MiB characters in one string).
  max_images: image parts in one observation. max_parts: parts in one observation.
  """

  max_pixels: int = 4096 * 4096
  max_image_bytes: int = 6_000_000
  max_images: int = 8
  max_parts: int = 64


DEFAULT_IMAGE_LIMITS = ImageLimits()


def text_part(text: str) -> dict[str, Any]:
  if not isinstance(text, str):
    raise TypeError(f"text_part: text must be a str, got {type(text).__name__}")
  return {"type": "text", "text": text}


def png_bytes(image: Any) -> bytes:
  """`image` (a PIL image, a uint8 array [H, W] / [H, W, 3] / [H, W, 4], or PNG bytes) as PNG bytes;
  TypeError / ValueError naming what is wrong."""
  if isinstance(image, (bytes, bytearray)):
    return bytes(image)
  if isinstance(image, Image.Image):
    pil = image if image.mode in ALLOWED_MODES else image.convert("RGBA" if "A" in image.getbands() else "RGB")
  elif hasattr(image, "__array_interface__") or hasattr(image, "__array__"):
    import numpy as np

    array = np.asarray(image)
    if array.dtype != np.uint8:
      raise TypeError(f"image array must have dtype uint8, got {array.dtype}")
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
      raise ValueError(f"image array must be [H, W], [H, W, 3] or [H, W, 4], got shape {list(array.shape)}")
    if array.size == 0:
      raise ValueError(f"image array is empty: shape {list(array.shape)}")
    pil = Image.fromarray(array)
  else:
    raise TypeError(f"an image is a PIL image, a uint8 array or PNG bytes, got {type(image).__name__}")
  out = io.BytesIO()
  pil.save(out, format="PNG")
  return out.getvalue()


def image_part(image: Any, limits: ImageLimits = DEFAULT_IMAGE_LIMITS) -> dict[str, Any]:
  """One image part (a PNG data URL) from a PIL image, a uint8 array or PNG bytes, checked against
  `limits` (ObservationError naming what is over)."""
  data = png_bytes(image)
  part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode("ascii")}}
  decode_image_part(part, limits)
  return part


def observation(text: str, *images: Any) -> list[dict[str, Any]]:
  """A text part followed by one image part per image."""
  return [text_part(text), *(image_part(image) for image in images)]


def _data_url(part: dict, where: str) -> tuple[str, str]:
  """(media type, base64 payload) of an image part; ObservationError naming the field."""
  if set(part) != {"type", "image_url"}:
    raise ObservationError(f"{where}: an image part has exactly the keys 'type' and 'image_url', got {sorted(part)}")
  inner = part["image_url"]
  if not isinstance(inner, dict) or not isinstance(inner.get("url"), str):
    raise ObservationError(f"{where}.image_url: must be an object with a string 'url'")
  url = inner["url"]
  head, sep, payload = url.partition(",")
  if not sep or not head.startswith("data:") or not head.endswith(";base64"):
    raise ObservationError(f"{where}.image_url.url: must be a data URL 'data:image/png;base64,...', got {url[:40]!r}")
  media = head[len("data:") : -len(";base64")]
  if media not in MEDIA_TYPES:
    raise ObservationError(f"{where}.image_url.url: media type {media!r} is not one of {sorted(MEDIA_TYPES)}")
  return media, payload


def decode_image_part(part: dict, limits: ImageLimits = DEFAULT_IMAGE_LIMITS, where: str = "image") -> Image.Image:
  """The decoded image of an image part, after the bounded checks (module docstring); ObservationError
  naming `where` and what is wrong."""
  media, payload = _data_url(part, where)
  declared = len(payload) * 3 // 4  # base64 length -> bytes, before decoding anything
  if declared > limits.max_image_bytes:
    raise ObservationError(f"{where}: {declared:,} bytes of image data; the limit is {limits.max_image_bytes:,}")
  try:
    data = base64.b64decode(payload, validate=True)
  except (binascii.Error, ValueError) as e:
    raise ObservationError(f"{where}.image_url.url: the base64 payload does not decode: {e}") from None
  try:
    image = Image.open(io.BytesIO(data), formats=[MEDIA_TYPES[media]])
  except Image.DecompressionBombError as e:  # Pillow's own header check, past twice its limit
    raise ObservationError(f"{where}: its header declares over {limits.max_pixels:,} pixels ({e})") from None
  except Exception as e:  # noqa: BLE001 -- Pillow raises several types for data it cannot identify
    raise ObservationError(f"{where}: not a decodable {media} image ({type(e).__name__}: {e})") from None
  width, height = image.size
  if width * height > limits.max_pixels:
    raise ObservationError(
      f"{where}: {width}x{height} = {width * height:,} pixels declared; the limit is {limits.max_pixels:,}"
    )
  if image.mode not in ALLOWED_MODES:
    raise ObservationError(f"{where}: mode {image.mode!r} is not one of {list(ALLOWED_MODES)}")
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("error", Image.DecompressionBombWarning)
      image.load()
  except Exception as e:  # noqa: BLE001 -- truncated / corrupt data
    raise ObservationError(f"{where}: the {media} data does not decode ({type(e).__name__}: {e})") from None
  return image


def check_observation(obs: Any, limits: ImageLimits = DEFAULT_IMAGE_LIMITS) -> None:
  """None if `obs` is a str or a list of valid parts within `limits`; else ObservationError naming the
  part (`observation[i]`) and what is wrong."""
  if isinstance(obs, str):
    return
  if not isinstance(obs, list):
    raise ObservationError(f"an observation is a str or a list of parts, got {type(obs).__name__}")
  if not obs:
    raise ObservationError("an observation list must have at least one part")
  if len(obs) > limits.max_parts:
    raise ObservationError(f"the observation has {len(obs)} parts; the limit is {limits.max_parts}")
  images = sum(1 for p in obs if isinstance(p, dict) and p.get("type") == "image_url")
  if images > limits.max_images:
    raise ObservationError(f"the observation has {images} images; the limit is {limits.max_images}")
  for i, part in enumerate(obs):
    where = f"observation[{i}]"
    if not isinstance(part, dict):
      raise ObservationError(f"{where}: a part is an object, got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
      if set(part) != {"type", "text"} or not isinstance(part["text"], str):
        raise ObservationError(f"{where}: a text part is {{'type': 'text', 'text': str}}, got keys {sorted(part)}")
    elif kind == "image_url":
      decode_image_part(part, limits, where)
    else:
      raise ObservationError(f"{where}.type: must be 'text' or 'image_url', got {kind!r}")


def part_chars(obs: Any) -> int:
  """Characters of an observation list's texts and image URLs (0 for anything else): what its check
  decodes and roughly what it adds to a reply frame."""
  if not isinstance(obs, list):
    return 0
  total = 0
  for part in obs:
    if isinstance(part, dict):
      inner = part.get("image_url")
      url = inner.get("url") if isinstance(inner, dict) else None
      total += len(url) if isinstance(url, str) else 0
      total += len(part["text"]) if isinstance(part.get("text"), str) else 0
  return total
