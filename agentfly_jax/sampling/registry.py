"""Samplers by name (`config.rollout.sampler`): a builder per name, from one `SamplerRequest`.

    register_sampler("mine", build_mine)     # build_mine(request) -> SamplerBuild
    sampler_names()                          # ("jax", "jax_static", "vllm", "mine")
    build = build_sampler("jax", request)    # build.sampler, build.model_dir

The run config's `rollout.sampler` is checked against `sampler_names()`, so a registered sampler
is accepted by the config without an edit there.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class SamplerRequest:
  """What a sampler is built from.

  model: the policy (an nnx module; its own copy when the sampler lives on a sub-mesh or per
    process); policy: the trainer's copy (what an engine that loads a folder saves); tokenizer /
    tokenizer_dir: the run's; max_len: prompt + generation tokens a sequence may hold; mesh /
    rules: where the JAX sampler's params go (None: unsharded); pretrained: the HF folder ("" =
    random init); workdir: where a random-init policy is saved for an engine that loads folders;
    lora: models.lora.LoRAConfig or None; engine: extra engine arguments (vLLM's
    gpu_memory_utilization).
  """

  model: Any
  policy: Any
  tokenizer: Any
  tokenizer_dir: str
  workdir: str
  seed: int
  max_batch_size: int
  max_len: int
  dtype: str
  mesh: Any = None
  rules: Any = None
  pretrained: str = ""
  lora: Any = None
  engine: dict = dataclasses.field(default_factory=dict)
  prefix_cache_tokens: int = 0  # jax_static's multi-turn prefix cache (0 = off; the engine always shares pages)
  paged: dict = dataclasses.field(default_factory=dict)  # jax (the engine): page_size, kv_cache_gib, decode_steps, ...


@dataclasses.dataclass(frozen=True)
class SamplerBuild:
  sampler: Any
  model_dir: str | None = None  # the HF folder the engine loaded (None: it holds the params itself)


def build_jax_sampler(r: SamplerRequest) -> SamplerBuild:
  from agentfly_jax.sampling.jax_sampler import JaxSampler

  return SamplerBuild(
    JaxSampler(
      r.model,
      r.tokenizer,
      max_batch_size=r.max_batch_size,
      max_len=r.max_len,
      seed=r.seed,
      mesh=r.mesh,
      sharding_rules=r.rules,
      prefix_cache_tokens=r.prefix_cache_tokens,
    )
  )


def build_paged_sampler(r: SamplerRequest) -> SamplerBuild:
  from agentfly_jax.sampling.engine import PagedJaxSampler

  return SamplerBuild(
    PagedJaxSampler(
      r.model,
      r.tokenizer,
      num_slots=r.max_batch_size,
      max_len=r.max_len,
      seed=r.seed,
      mesh=r.mesh,
      sharding_rules=r.rules,
      **r.paged,
    )
  )


def build_vllm_sampler(r: SamplerRequest) -> SamplerBuild:
  from agentfly_jax.models import save_pretrained
  from agentfly_jax.models.lora import merge_lora
  from agentfly_jax.sampling.vllm_sampler import VllmSampler

  model_dir = r.pretrained or os.path.join(r.workdir, "init_model")
  if not r.pretrained:  # the base (zero-B adapters change nothing: merged = base)
    save_pretrained(r.policy if r.lora is None else merge_lora(r.policy), model_dir, tokenizer_dir=r.tokenizer_dir)
  # a vision-language policy runs on the in-process batch engine (vllm_vl registers its model in this process)
  vision = getattr(getattr(r.policy, "config", None), "vision", None) is not None
  sampler = VllmSampler(
    model_dir,
    **({"engine": "batch", "in_process": True} if vision else {}),
    dtype=r.dtype,
    max_model_len=r.max_len,
    max_num_seqs=r.max_batch_size,
    max_batch_size=r.max_batch_size,
    seed=r.seed,
    lora=r.lora,
    **r.engine,
  )
  return SamplerBuild(sampler, model_dir)


_SAMPLERS: dict[str, Callable[[SamplerRequest], SamplerBuild]] = {
  "jax": build_paged_sampler,  # the continuous-batching engine over a paged KV cache (sampling/engine)
  "jax_static": build_jax_sampler,  # one padded batch per call, run to its slowest row (sampling/jax_sampler.py)
  "vllm": build_vllm_sampler,
}


def register_sampler(name: str, build: Callable[[SamplerRequest], SamplerBuild]) -> None:
  """Adds a sampler builder under `name` (ValueError if the name is taken)."""
  if name in _SAMPLERS:
    raise ValueError(f"sampler {name!r} is already registered")
  _SAMPLERS[name] = build


def sampler_names() -> tuple[str, ...]:
  """The registered sampler names."""
  return tuple(_SAMPLERS)


def build_sampler(name: str, request: SamplerRequest) -> SamplerBuild:
  """The sampler registered under `name`, built from `request`."""
  if name not in _SAMPLERS:
    raise ValueError(f"unknown sampler {name!r}; registered: {list(_SAMPLERS)}")
  return _SAMPLERS[name](request)
