"""The HF reference for image messages: transformers' `Qwen2_5_VLProcessor` over the real Qwen2.5 tokenizer.

The venv has no torchvision, so no video processor can be built; the processor's class check is skipped for that
one absent part only (images go through HF's own code unchanged).
"""

from __future__ import annotations

import functools

import numpy as np

from agentfly_jax.agents.chat_template import ChatTemplate
from agentfly_jax.agents.tokenizer import load_tokenizer
from agentfly_jax.models.qwen25_tokenizer import qwen25_tokenizer_folder
from agentfly_jax.vision.processor import QWEN25_VL_CHAT_TEMPLATE


@functools.lru_cache(maxsize=1)
def hf_processor():
  from transformers import AutoTokenizer, Qwen2_5_VLProcessor
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

  class NoVideoProcessor(Qwen2_5_VLProcessor):
    def check_argument_for_proper_class(self, argument_name, argument):
      if argument_name == "video_processor" and argument is None:
        return None
      return super().check_argument_for_proper_class(argument_name, argument)

  tok = AutoTokenizer.from_pretrained(qwen25_tokenizer_folder())
  return NoVideoProcessor(
    image_processor=Qwen2VLImageProcessorPil(),
    tokenizer=tok,
    video_processor=None,
    chat_template=QWEN25_VL_CHAT_TEMPLATE,
  )


@functools.lru_cache(maxsize=1)
def vl_tokenizer():
  """Our AgentTokenizer over the same Qwen2.5 files, rendering Qwen2.5-VL's chat template."""
  tok = load_tokenizer(qwen25_tokenizer_folder())
  tok.chat_template = ChatTemplate(QWEN25_VL_CHAT_TEMPLATE, tok.special_tokens)
  return tok


def random_image(rng: np.random.Generator, height: int, width: int, mode: str = "RGB"):
  from PIL import Image

  channels = {"RGB": 3, "RGBA": 4, "L": None}[mode]
  shape = (height, width) if channels is None else (height, width, channels)
  return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode)
