"""The Sampler protocol: token-id prompts in, new token ids + their log-probs out.

Every sampler (JAX, vLLM, scripted test samplers) keeps this contract; the rollout
(`agentfly_jax.agents`) knows samplers only through it. Token-in/token-out: the ids
returned here are the ids trained on, verbatim.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to sample. `temperature == 0` means greedy (log-probs then at temperature 1).

  Attributes:
    temperature: softmax temperature; 0 = greedy.
    top_p: nucleus mass in (0, 1]; 1 = off.
    top_k: keep the k most likely tokens; 0 = off.
    max_new_tokens: cap on generated tokens for this request (>= 1).
    stop_token_ids: generation stops after emitting any of these (the stop token is
      returned, with its log-prob: the model wrote it).
    seed: optional seed; equal seeds + equal inputs give equal outputs.
  """

  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 256
  stop_token_ids: tuple[int, ...] = ()
  seed: int | None = None

  def __post_init__(self):
    object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
    self.validate()

  def validate(self) -> None:
    """Raises ValueError naming the bad field."""
    if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0):
      raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature!r}")
    if not (0.0 < float(self.top_p) <= 1.0):
      raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
    if not (isinstance(self.top_k, int) and self.top_k >= 0):
      raise ValueError(f"SamplingParams.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
    if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
      raise ValueError(f"SamplingParams.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
    if any(t < 0 for t in self.stop_token_ids):
      raise ValueError(f"SamplingParams.stop_token_ids must be non-negative ids, got {self.stop_token_ids!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class PromptImages:
  """A prompt's images as the model's processor gives them (vision/processor.VisionProcessor, HF's processor).

  Attributes:
    pixel_values: float32[N, patch_dim], every image's patches, image after image.
    image_grid_thw: int64[I, 3], each image's (t, h, w) patch grid, in the order its pad tokens appear in the
      prompt (image i takes t * h * w rows of pixel_values and t * h * w / merge^2 pad tokens).
  """

  pixel_values: np.ndarray
  image_grid_thw: np.ndarray

  def __post_init__(self):
    pixels = np.asarray(self.pixel_values, np.float32)
    grid = np.asarray(self.image_grid_thw)
    if grid.ndim != 2 or grid.shape[1] != 3 or grid.shape[0] < 1 or not np.issubdtype(grid.dtype, np.integer):
      raise ValueError(f"PromptImages.image_grid_thw must be int [num_images >= 1, 3], got {grid.dtype}{grid.shape}")
    if pixels.ndim != 2 or pixels.shape[0] != int(np.prod(grid, axis=1).sum()):
      raise ValueError(
        f"PromptImages.pixel_values must be [sum of t * h * w = {int(np.prod(grid, axis=1).sum())}, patch_dim], "
        f"got shape {pixels.shape}"
      )
    object.__setattr__(self, "pixel_values", pixels)
    object.__setattr__(self, "image_grid_thw", grid.astype(np.int64))

  def digests(self) -> list[bytes]:
    """Per image, a sha256 of its grid and its pixel rows: equal digests, equal images."""
    out, start = [], 0
    for t, h, w in self.image_grid_thw.tolist():
      rows = self.pixel_values[start : start + t * h * w]
      out.append(hashlib.sha256(np.asarray([t, h, w], np.int64).tobytes() + rows.tobytes()).digest())
      start += t * h * w
    return out


async def agenerate_with_images(sampler, prompt, params, images: "PromptImages | None" = None, prompt_routes=None):
  """`sampler.agenerate(prompt, params)`, with `images=` only when there are some: a text request reaches every
  sampler (one written before images, too) in the protocol's two-argument form. `prompt_routes` (a chain's
  recorded SampleResult.routed_experts of its first prompt tokens) go to a sampler that replays them
  (`replays_prompt_routes`: the paged engine with a mixture of experts), so tokens computed again (an evicted
  prefix) route as they first did."""
  kwargs = {} if images is None else {"images": images}
  if prompt_routes is not None and getattr(sampler, "replays_prompt_routes", False):
    kwargs["prompt_routes"] = prompt_routes
  return await sampler.agenerate(prompt, params, **kwargs)


def refuse_images(images, sampler: str) -> None:
  """ValueError when a sampler that takes no images got some (`images`: None or one entry per prompt)."""
  if images is not None and any(im is not None for im in images):
    raise ValueError(
      f"{sampler} takes no images; image requests need the paged JAX engine (rollout.sampler=jax, "
      "PagedJaxSampler) or vLLM (rollout.sampler=vllm) with a vision-language model"
    )


@dataclasses.dataclass
class SampleResult:
  """One request's output.

  Attributes:
    token_ids: the new token ids, int, length N (includes the stop token if one was emitted).
    logprobs: float log-probs of exactly those tokens under the sampling distribution
      (at the sampling temperature), length N.
    finish_reason: "stop" (a stop token was emitted) or "length" (max_new_tokens reached).
    policy_version: the trainer's policy version that wrote it, where a version gate tracks one
      (rl/partial_rollout.VersionedSampler); None otherwise.
    token_versions: per token, how many weight updates the sampler had landed when it wrote the token (empty:
      not tracked); differs within a request only when an update landed mid-request and the sampler continued
      on the new weights (the paged engine's weight_update="recompute").
    routed_experts: a mixture-of-experts model on a sampler that records routes (the paged engine): int[n, Lm, k]
      with n = len(prompt) + len(token_ids) - 1, for every token the sampler fed the model (the prompt, then each
      new token but the last) the experts each of the Lm sparse layers sent it to (router replay,
      `model.router_replay`); None: a dense model, or a sampler that records no routes.
  """

  token_ids: list[int]
  logprobs: list[float]
  finish_reason: str
  policy_version: int | None = None
  token_versions: list[int] = dataclasses.field(default_factory=list)
  routed_experts: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class SyncStats:
  """What one `update_weights` moved: bytes (LoRA: the adapters), seconds it took and which
  loader ran (vLLM: "packed", "reload_weights", "lora_request"; None where there is one way)."""

  bytes: int
  seconds: float | None = None
  path: str | None = None


@runtime_checkable
class Sampler(Protocol):
  """What the rollout needs from a sampler."""

  def generate(
    self, prompts: Sequence[Sequence[int]], params: SamplingParams, images: Sequence[PromptImages | None] | None = None
  ) -> list[SampleResult]:
    """Synchronous batch generation: one SampleResult per prompt, in order. `images`: None, or per prompt its
    PromptImages (None: text only); a sampler that takes no images refuses them (`refuse_images`)."""
    ...

  async def agenerate(
    self, prompt: Sequence[int], params: SamplingParams, images: PromptImages | None = None
  ) -> SampleResult:
    """Async (trio) single request; concurrent callers are batched together by the sampler."""
    ...

  def update_weights(self, params: Any) -> SyncStats | None:
    """Load new policy params (an nnx.State of the policy) into this sampler; returns what the
    load moved (None: a sampler that does not measure it)."""
    ...
