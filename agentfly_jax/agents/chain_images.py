"""The token ids of rendered chat text whose messages may hold image parts, for the rollout.

Text without images is tokenized as before (`tokenizer.encode`). With images, the agent's `vision`
(`agentfly_jax.vision.processor.VisionProcessor`) repeats each image placeholder its image-token count and
returns the images with their grids; an agent without one refuses image parts (an ImageError naming the part).

  ids, images, grid, pixels = encode_with_images(agent, text, new_messages, first_index=len(messages_before))
  ids, images, grid, pixels = await aencode_with_images(...)   # the same; images processed in a worker thread
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence

import numpy as np
import trio

from agentfly_jax.vision.content import message_images
from agentfly_jax.vision.processor import check_text_only


def encode_with_images(
  agent, text: str, messages: Sequence[Mapping], max_tokens: int | None = None, first_index: int = 0
) -> tuple[list[int], list, np.ndarray, np.ndarray | None]:
  """(ids, RGB images, image_grid_thw int32[N, 3], pixel_values float32[P, patch_dim] or None) of `text`, the
  rendering of `messages`' new part (no images: [], int32[0, 3], None).

  Args:
    agent: has `tokenizer` and `vision` (a VisionProcessor, or None for a text-only model).
    text: the rendered text; its image placeholders stand for the image parts of `messages`, in order.
    messages: the messages `text` renders (only their image parts are read).
    max_tokens: the image tokens allowed (an ImageError naming the image past it); None: no check.
    first_index: the conversation index of `messages[0]` (errors name "messages[i].content[j]").
  """
  images = message_images(messages, first_index)
  if not images:
    return agent.tokenizer.encode(text), [], np.zeros((0, 3), np.int32), None
  vision = getattr(agent, "vision", None)
  if vision is None:
    check_text_only(messages, f"{type(agent).__name__}'s model", first_index)
  enc = vision.encode_text(agent.tokenizer, text, images, max_tokens)
  return enc.token_ids.tolist(), enc.images, enc.image_grid_thw, enc.pixel_values


async def aencode_with_images(
  agent, text: str, messages: Sequence[Mapping], max_tokens: int | None = None, first_index: int = 0
) -> tuple[list[int], list, np.ndarray, np.ndarray | None]:
  """`encode_with_images` inside trio: text alone is tokenized inline as before; with images the decoding and
  image processing (about 0.17 s for a 768 x 1024 image) run in a worker thread, so other chains go on."""
  if not message_images(messages):
    return agent.tokenizer.encode(text), [], np.zeros((0, 3), np.int32), None
  call = functools.partial(encode_with_images, agent, text, messages, max_tokens, first_index)
  return await trio.to_thread.run_sync(call)
