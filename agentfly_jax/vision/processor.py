"""Messages with image parts -> token ids, pixel values and image grid sizes, as HF's Qwen2.5-VL processor.

The chat template renders each image part as `<|vision_start|><|image_pad|><|vision_end|>`; the image
processor (transformers' PIL `Qwen2VLImageProcessorPil`: smart resize, rescale, normalize, 14 x 14 patches,
2 x 2 merge) gives each image its grid (t, h, w); each `<|image_pad|>` is then repeated t*h*w / merge**2 times
and the text tokenized, which is what `Qwen2_5_VLProcessor.__call__` does.

  vision = VisionProcessor()                                 # transformers' Qwen2-VL image processor defaults
  vision = VisionProcessor.from_pretrained(model_dir)        # a model's own preprocessor_config.json
  enc = vision.encode(tokenizer, messages, add_generation_prompt=True, max_tokens=4096)
  enc.token_ids        # int32[T]
  enc.pixel_values     # float32[P, 3 * 2 * 14 * 14], the patches of all images in order
  enc.image_grid_thw   # int32[N, 3]
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import numpy as np

from agentfly_jax.vision.content import message_images
from agentfly_jax.vision.decode import DEFAULT_MAX_PIXELS, ImageError, decode_image

IMAGE_TOKEN = "<|image_pad|>"
IMAGE_PLACEHOLDER_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"

# The chat template published with Qwen2.5-VL-Instruct (chat_template.json): image / video parts as vision
# placeholders, text parts verbatim, a default system message.
QWEN25_VL_CHAT_TEMPLATE = (
  "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
  "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
  "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
  "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
  "{% else %}{% for content in message['content'] %}"
  "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
  "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
  "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
  "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
  "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
  "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
  "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclasses.dataclass
class VisionEncoding:
  """Token ids with their images.

  Attributes:
    token_ids: int32[T], each image's `<|image_pad|>` repeated its token count.
    pixel_values: float32[P, D], the flattened patches of all images in order (P = sum of t*h*w).
    image_grid_thw: int32[N, 3], (t, h, w) in patches of each image.
    images: the N RGB PIL images, in order.
  """

  token_ids: np.ndarray
  pixel_values: np.ndarray
  image_grid_thw: np.ndarray
  images: list


class VisionProcessor:
  """The image processor of a Qwen2-VL / Qwen2.5-VL model and its image-token rule.

  Args:
    image_processor: a transformers Qwen2-VL image processor; default `Qwen2VLImageProcessorPil()` (its defaults:
      images resized to between 56*56 and 28*28*1280 pixels) with `min_pixels` / `max_pixels` when given (a
      model's resize bounds; Qwen2.5-VL-Instruct's preprocessor_config.json sets its own, read by `from_pretrained`).
    max_pixels_decoded: the largest declared pixel count an image may have before it is decoded at all.
  """

  def __init__(
    self,
    image_processor: Any = None,
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    max_pixels_decoded: int = DEFAULT_MAX_PIXELS,
  ):
    if image_processor is None:
      from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

      kwargs = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
      image_processor = Qwen2VLImageProcessorPil(**kwargs)
    self.image_processor = image_processor
    self.merge_size = int(image_processor.merge_size)
    self.max_pixels_decoded = int(max_pixels_decoded)

  @classmethod
  def from_pretrained(cls, folder: str | os.PathLike, **kwargs) -> "VisionProcessor":
    """The image processor of an HF model folder (its preprocessor_config.json)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = os.path.join(os.fspath(folder), "preprocessor_config.json")
    if not os.path.isfile(path):
      raise FileNotFoundError(f"VisionProcessor.from_pretrained: {path} does not exist (a vision model's folder)")
    bounds = {k: kwargs.pop(k) for k in ("min_pixels", "max_pixels") if kwargs.get(k) is not None}
    return cls(Qwen2VLImageProcessorPil.from_pretrained(os.fspath(folder), **bounds), **kwargs)

  @classmethod
  def for_model(
    cls, vision_config, *, min_pixels: int | None = None, max_pixels: int | None = None, **kwargs
  ) -> "VisionProcessor":
    """The processor whose patches a vision tower (models.VisionConfig) takes: its patch, temporal patch and
    merge sizes, with resize bounds `min_pixels` / `max_pixels` (None: transformers' defaults)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    bounds = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
    processor = Qwen2VLImageProcessorPil(
      patch_size=vision_config.patch_size,
      temporal_patch_size=vision_config.temporal_patch_size,
      merge_size=vision_config.spatial_merge_size,
      **bounds,
    )
    return cls(processor, **kwargs)

  def process(self, images: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values float32[P, D], image_grid_thw int32[N, 3]) of N RGB PIL images."""
    if not images:
      return np.zeros((0, 0), np.float32), np.zeros((0, 3), np.int32)
    out = self.image_processor(images=list(images), return_tensors="np")
    return np.asarray(out["pixel_values"], np.float32), np.asarray(out["image_grid_thw"], np.int32)

  def num_image_tokens(self, image_grid_thw: np.ndarray) -> list[int]:
    """The `<|image_pad|>` count of each image: t*h*w / merge_size**2."""
    return [int(np.prod(g)) // (self.merge_size**2) for g in np.asarray(image_grid_thw).reshape(-1, 3)]

  def expand(self, text: str, image_grid_thw: np.ndarray, where: str = "text") -> str:
    """`text` with its k-th `<|image_pad|>` repeated image k's token count."""
    counts = self.num_image_tokens(image_grid_thw)
    pieces = text.split(IMAGE_TOKEN)
    if len(pieces) - 1 != len(counts):
      raise ImageError(
        f"{where}: the rendered text has {len(pieces) - 1} image placeholder(s) but {len(counts)} image(s) were "
        f"given (does the chat template render image parts?)"
      )
    out = [pieces[0]]
    for n, piece in zip(counts, pieces[1:]):
      out.append(IMAGE_TOKEN * n)
      out.append(piece)
    return "".join(out)

  def encode_text(
    self, tokenizer, text: str, images: Sequence[tuple[Any, str]], max_tokens: int | None = None
  ) -> VisionEncoding:
    """Token ids of rendered `text` whose image placeholders stand for `images` ((value, field) in order).

    Raises:
      ImageError naming the field of an image that does not decode, or whose image tokens (with those
      before it) exceed `max_tokens`.
    """
    decoded = [decode_image(v, field, self.max_pixels_decoded) for v, field in images]
    pixel_values, grid = self.process(decoded)
    if max_tokens is not None:
      total = 0
      for n, (_, field) in zip(self.num_image_tokens(grid), images):
        total += n
        if total > max_tokens:
          raise ImageError(
            f"{field}: the image needs {n} image tokens ({total} with the images before it), more than the "
            f"{max_tokens} tokens the context has room for; send a smaller image or raise the context limit"
          )
    ids = np.asarray(tokenizer.encode(self.expand(text, grid)), np.int32)
    if max_tokens is not None and ids.shape[0] > max_tokens:
      field = images[-1][1] if images else "text"
      raise ImageError(f"{field}: the text with its images is {ids.shape[0]} tokens, more than {max_tokens}")
    return VisionEncoding(ids, pixel_values, grid, decoded)

  def encode(
    self,
    tokenizer,
    messages: Sequence[Mapping],
    tools: Sequence[Mapping] | None = None,
    add_generation_prompt: bool = False,
    max_tokens: int | None = None,
    **template_kwargs,
  ) -> VisionEncoding:
    """`messages` rendered with the tokenizer's chat template, then `encode_text`."""
    text = tokenizer.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, **template_kwargs)
    return self.encode_text(tokenizer, text, message_images(messages), max_tokens)


def check_text_only(messages: Sequence[Mapping], model: str = "the model", first_index: int = 0) -> None:
  """Raises ImageError naming the first image part of `messages` (counted from `first_index`): `model` reads
  text only."""
  found = message_images(messages, first_index)
  if found:
    raise ImageError(f"{found[0][1]}: an image part, but {model} reads text only (no image processor)")
