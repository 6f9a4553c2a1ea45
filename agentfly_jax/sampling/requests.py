"""Checking sampler requests and choosing static shape buckets. Shared by the samplers."""

from __future__ import annotations

import bisect
from typing import Any, Sequence

import numpy as np

from agentfly_jax.sampling.protocol import SamplingParams


def validate_request(prompt: Any, params: Any, *, label: str, max_len: int, vocab_size: int | None) -> None:
  """Raises ValueError naming `label` (e.g. "request 3") and what is wrong with it.

  Checks: params is a valid SamplingParams; the prompt is a non-empty sequence of int ids in
  [0, vocab_size); it is shorter than `max_len` (the context), so at least one token fits.
  """
  if not isinstance(params, SamplingParams):
    raise ValueError(f"{label}: sampling params must be a SamplingParams, got {type(params).__name__}")
  try:
    params.validate()
  except ValueError as e:
    raise ValueError(f"{label}: bad sampling params: {e}") from None
  if isinstance(params.temperature, bool) or isinstance(params.top_k, bool):
    raise ValueError(f"{label}: bad sampling params: temperature/top_k must be numbers, not bool")
  if isinstance(prompt, (str, bytes)):
    raise ValueError(
      f"{label}: prompt must be a sequence of int token ids, got {type(prompt).__name__} (tokenize it first)"
    )
  try:
    ids = np.asarray(prompt)
  except Exception as e:  # ragged or odd objects
    raise ValueError(f"{label}: prompt must be a flat sequence of int token ids ({e})") from None
  if ids.ndim != 1:
    raise ValueError(f"{label}: prompt must be a flat sequence of int token ids, got shape {ids.shape}")
  if ids.size == 0:
    raise ValueError(f"{label}: prompt is empty (a prompt needs at least one token id)")
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"{label}: prompt must hold int token ids, got dtype {ids.dtype}")
  if ids.size >= max_len:
    raise ValueError(
      f"{label}: prompt has {ids.size} tokens but the sampler's context is max_len={max_len} "
      f"(a prompt must be shorter than max_len to leave room for a new token)"
    )
  bad = np.flatnonzero((ids < 0) | ((ids >= vocab_size) if vocab_size else False))
  if bad.size:
    raise ValueError(
      f"{label}: prompt token id {int(ids[bad[0]])} at position {int(bad[0])} is outside "
      f"the vocabulary [0, {vocab_size})"
    )
  if vocab_size:
    bad_stop = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad_stop:
      raise ValueError(f"{label}: stop_token_ids {bad_stop} are outside the vocabulary [0, {vocab_size})")


def per_request_params(params: SamplingParams | Sequence[SamplingParams], num_prompts: int) -> list:
  """One SamplingParams for every prompt (a single one is shared by all)."""
  if isinstance(params, SamplingParams):
    return [params] * num_prompts
  if isinstance(params, (list, tuple)):
    if len(params) != num_prompts:
      raise ValueError(f"got {len(params)} SamplingParams for {num_prompts} prompts (need one, or one per prompt)")
    return list(params)
  raise ValueError(f"params must be a SamplingParams or a list of them, got {type(params).__name__}")


def power_of_two_buckets(lo: int, hi: int) -> tuple[int, ...]:
  """(lo, 2 lo, 4 lo, ..., hi): powers-of-two multiples of lo below hi, then hi itself."""
  out, b = [], max(1, lo)
  while b < hi:
    out.append(b)
    b *= 2
  out.append(hi)
  return tuple(out)


def pick_bucket(value: int, buckets: Sequence[int], what: str) -> int:
  """The smallest bucket >= value; `buckets` sorted ascending."""
  i = bisect.bisect_left(buckets, value)
  if i == len(buckets):
    raise ValueError(f"{what} {value} exceeds the largest bucket {buckets[-1]}")
  return buckets[i]
