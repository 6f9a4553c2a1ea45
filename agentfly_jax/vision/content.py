"""Message content lists with image parts (the OpenAI / HF form), checked and normalized.

A content list is `[{"type": "text", "text": str}, {"type": "image", "image": PIL | array | bytes | data URL},
{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}, ...]`. `normalize_content` decodes every
image part (decode.py: bounds, RGB) into `{"type": "image", "image": <RGB PIL image>}`, so a normalized message
renders the same through any HF chat template and holds only decoded images. A tool's or an environment's
value becomes such a list with `to_content_parts` when it holds an image.

  parts = to_content_parts(["before", png_bytes], field="tool 'shot'")
  images = message_images(messages)        # [(PIL image, "messages[2].content[1]"), ...] in order
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from agentfly_jax.vision.decode import DEFAULT_MAX_PIXELS, ImageError, decode_image

IMAGE_PLACEHOLDER = "<image>"  # an image part in a plain-text view (transcripts, tool records)


def is_image_value(value: Any) -> bool:
  """True for a raw image value a tool may return: a PIL image, a numpy array, or encoded bytes."""
  if isinstance(value, (np.ndarray, bytes, bytearray, memoryview)):
    return True
  try:
    from PIL import Image
  except ImportError:  # pragma: no cover - Pillow is a dependency
    return False
  return isinstance(value, Image.Image)


def _is_image_part(part: Any) -> bool:
  return isinstance(part, Mapping) and (
    part.get("type") in ("image", "image_url") or "image" in part or "image_url" in part
  )


def normalize_part(part: Any, field: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> dict:
  """One content part checked: text kept, an image decoded to `{"type": "image", "image": RGB PIL}`."""
  if not isinstance(part, Mapping):
    raise ImageError(f"{field}: a content part must be a dict with a 'type', got {type(part).__name__}")
  kind = part.get("type")
  if kind == "text":
    if not isinstance(part.get("text"), str):
      raise ImageError(f"{field}.text: a text part needs a string 'text', got {type(part.get('text')).__name__}")
    return {"type": "text", "text": part["text"]}
  if kind == "image" or (kind is None and "image" in part):
    if "image" not in part:
      raise ImageError(f"{field}.image: an image part needs an 'image' (PIL image, uint8 array, bytes or data URL)")
    return {"type": "image", "image": decode_image(part["image"], f"{field}.image", max_pixels)}
  if kind == "image_url" or (kind is None and "image_url" in part):
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, Mapping) else url
    if not isinstance(url, str):
      raise ImageError(f"{field}.image_url.url: an image_url part needs {{'url': 'data:image/...;base64,...'}}")
    return {"type": "image", "image": decode_image(url, f"{field}.image_url.url", max_pixels)}
  raise ImageError(f"{field}.type: expected 'text', 'image' or 'image_url', got {kind!r}")


def normalize_content(content: Any, field: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> str | list[dict]:
  """A message's content: a str as is, a list of parts each normalized (`normalize_part`)."""
  if isinstance(content, str):
    return content
  if not isinstance(content, (list, tuple)):
    raise ImageError(f"{field}: content must be a string or a list of parts, got {type(content).__name__}")
  return [normalize_part(p, f"{field}[{i}]", max_pixels) for i, p in enumerate(content)]


def has_images(content: Any) -> bool:
  """True when `content` is a list holding at least one image part."""
  return isinstance(content, (list, tuple)) and any(_is_image_part(p) for p in content)


def to_content_parts(value: Any, field: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> list[dict] | None:
  """A tool's / environment's value as normalized content parts when it holds an image, else None.

  An image (PIL, uint8 array, bytes) -> one image part; a list mixing str, images and part dicts -> those parts
  in order. Anything without an image -> None (the value stays on the text path).
  """
  if is_image_value(value):
    return [normalize_part({"type": "image", "image": value}, f"{field}[0]", max_pixels)]
  if not isinstance(value, (list, tuple)) or not any(is_image_value(v) or _is_image_part(v) for v in value):
    return None
  parts = []
  for i, v in enumerate(value):
    if isinstance(v, str):
      parts.append({"type": "text", "text": v})
    elif is_image_value(v):
      parts.append(normalize_part({"type": "image", "image": v}, f"{field}[{i}]", max_pixels))
    else:
      parts.append(normalize_part(v, f"{field}[{i}]", max_pixels))
  return parts


def content_text(content: str | Sequence[Mapping]) -> str:
  """The plain-text view of a content: text parts in order, `<image>` for each image part."""
  if isinstance(content, str):
    return content
  return "".join(p["text"] if p.get("type") == "text" else IMAGE_PLACEHOLDER for p in content)


def message_images(messages: Sequence[Mapping], first_index: int = 0) -> list[tuple[Any, str]]:
  """The image parts of `messages` in order, each as (its image value, "messages[i].content[j]"; an image_url
  part's field ends ".image_url.url"); i counts from `first_index` (messages appended to a longer conversation)."""
  out = []
  for i, m in enumerate(messages, start=first_index):
    content = m.get("content") if isinstance(m, Mapping) else None
    if isinstance(content, (list, tuple)):
      for j, p in enumerate(content):
        if _is_image_part(p):
          field = f"messages[{i}].content[{j}]"
          if "image" in p:
            out.append((p["image"], field))
          else:
            url = p.get("image_url")
            out.append((url.get("url") if isinstance(url, Mapping) else url, f"{field}.image_url.url"))
  return out


def framed(prefix: str, content: str | list[dict], suffix: str = "") -> str | list[dict]:
  """`prefix + content + suffix`: a str for text, a content list (text parts around the parts) otherwise."""
  if isinstance(content, str):
    return prefix + content + suffix
  return [{"type": "text", "text": prefix}, *content] + ([{"type": "text", "text": suffix}] if suffix else [])


def join_content(pieces: Sequence[str | list[dict]], sep: str) -> str | list[dict]:
  """`sep.join(pieces)`: a str when every piece is text, else one content list with `sep` text parts between."""
  if all(isinstance(p, str) for p in pieces):
    return sep.join(pieces)
  out: list[dict] = []
  for i, p in enumerate(pieces):
    if i:
      out.append({"type": "text", "text": sep})
    out.extend([{"type": "text", "text": p}] if isinstance(p, str) else p)
  return out
