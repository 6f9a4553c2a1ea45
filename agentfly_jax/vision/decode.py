"""One image value -> a `PIL.Image` in RGB, refused with an error naming its field when it cannot be.

Accepted values: a `PIL.Image.Image`, a uint8 numpy array (H x W, H x W x 1, H x W x 3 or H x W x 4), encoded
image bytes (PNG, JPEG, ...) and a `data:image/...;base64,...` URL string. The declared pixel count of encoded
bytes is checked from the header before the pixels are decoded (a decompression bomb never reaches memory).
Modes other than RGB are converted the way HF image processors do (`transformers.image_transforms.convert_to_rgb`:
alpha composited onto white); a mode Pillow cannot convert is refused.

  image = decode_image(value, field="messages[1].content[0].image")
  url = image_data_url(image)      # "data:image/png;base64,..."
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np

# Pillow's own bound (about 89.5 M pixels); a caller may pass a smaller one.
DEFAULT_MAX_PIXELS = 89_478_485
DATA_URL_PREFIX = "data:image/"


class ImageError(ValueError):
  """An image value that cannot be used; the message names its field."""


def _pil():
  from PIL import Image

  return Image


def _check_size(width: int, height: int, field: str, max_pixels: int) -> None:
  if width <= 0 or height <= 0:
    raise ImageError(f"{field}: the image has no pixels ({width} x {height})")
  if width * height > max_pixels:
    raise ImageError(
      f"{field}: the image declares {width} x {height} = {width * height} pixels, more than the limit of "
      f"{max_pixels} (a decompression bomb or an oversized image); send a smaller image"
    )


def _from_bytes(data: bytes, field: str, max_pixels: int):
  Image = _pil()
  try:
    image = Image.open(io.BytesIO(data))  # reads the header only: size known, pixels not decoded yet
  except Image.DecompressionBombError as e:
    raise ImageError(f"{field}: the image declares more pixels than the limit of {max_pixels} ({e})") from e
  except Exception as e:
    raise ImageError(f"{field}: the bytes do not decode as an image ({type(e).__name__}: {e})") from e
  _check_size(image.width, image.height, field, max_pixels)
  try:
    image.load()
  except Exception as e:
    raise ImageError(f"{field}: the image is truncated or corrupt ({type(e).__name__}: {e})") from e
  return image


def _from_data_url(url: str, field: str, max_pixels: int):
  head, sep, payload = url.partition(",")
  if not sep or not head.startswith(DATA_URL_PREFIX) or not head.endswith(";base64"):
    raise ImageError(f"{field}: expected a 'data:image/<format>;base64,<data>' URL, got {url[:48]!r}")
  try:
    data = base64.b64decode(payload, validate=True)
  except (binascii.Error, ValueError) as e:
    raise ImageError(f"{field}: the data URL's payload is not valid base64 ({e})") from e
  return _from_bytes(data, field, max_pixels)


def _from_array(array: np.ndarray, field: str):
  if array.dtype != np.uint8:
    raise ImageError(f"{field}: an image array must be uint8 (H x W x 3), got dtype {array.dtype}")
  if array.ndim == 3 and array.shape[-1] == 1:
    array = array[..., 0]
  if array.ndim == 2:
    mode = "L"
  elif array.ndim == 3 and array.shape[-1] in (3, 4):
    mode = "RGB" if array.shape[-1] == 3 else "RGBA"
  else:
    raise ImageError(f"{field}: an image array must be H x W, H x W x 3 or H x W x 4, got shape {array.shape}")
  return _pil().fromarray(np.ascontiguousarray(array), mode=mode)


def to_rgb(image, field: str):
  """`image` in RGB as HF image processors convert it (alpha onto white); an error naming `field` if it cannot be."""
  if image.mode == "RGB":
    return image
  from transformers.image_transforms import convert_to_rgb

  try:
    out = convert_to_rgb(image)
  except Exception as e:
    raise ImageError(f"{field}: an image in mode {image.mode!r} cannot be converted to RGB ({e})") from e
  if getattr(out, "mode", None) != "RGB":
    raise ImageError(f"{field}: an image in mode {image.mode!r} cannot be converted to RGB")
  return out


def decode_image(value: Any, field: str, max_pixels: int = DEFAULT_MAX_PIXELS):
  """`value` (PIL image | uint8 array | encoded bytes | data URL) as an RGB `PIL.Image.Image`.

  Raises:
    ImageError naming `field`: not an image, does not decode, more than `max_pixels` pixels, a mode that
    does not convert to RGB.
  """
  Image = _pil()
  if isinstance(value, Image.Image):
    _check_size(value.width, value.height, field, max_pixels)
    image = value
  elif isinstance(value, np.ndarray):
    if value.ndim >= 2:
      _check_size(int(value.shape[1]), int(value.shape[0]), field, max_pixels)
    image = _from_array(value, field)
  elif isinstance(value, (bytes, bytearray, memoryview)):
    image = _from_bytes(bytes(value), field, max_pixels)
  elif isinstance(value, str) and value.startswith("data:"):
    image = _from_data_url(value, field, max_pixels)
  elif isinstance(value, str):
    raise ImageError(f"{field}: only inline 'data:image/...;base64,' URLs are read (no fetching), got {value[:48]!r}")
  else:
    raise ImageError(
      f"{field}: expected a PIL image, a uint8 numpy array, image bytes or a data URL, got {type(value).__name__}"
    )
  return to_rgb(image, field)


def image_png_bytes(image) -> bytes:
  """The PNG encoding of a PIL image."""
  buf = io.BytesIO()
  image.save(buf, format="PNG")
  return buf.getvalue()


def image_data_url(image) -> str:
  """A PIL image as a `data:image/png;base64,...` URL (the env-server wire form)."""
  return "data:image/png;base64," + base64.b64encode(image_png_bytes(image)).decode("ascii")
