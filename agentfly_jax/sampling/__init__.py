"""Samplers: the protocol, the JAX sampler, the vLLM sampler, weight sync.

    from agentfly_jax.sampling import JaxSampler, VllmSampler, SamplingParams

The protocol names import light (no JAX); the samplers load on first use.
"""

from agentfly_jax.sampling.protocol import PromptImages, Sampler, SampleResult, SamplingParams, SyncStats

_LAZY = {
  "JaxSampler": "agentfly_jax.sampling.jax_sampler",
  "VllmSampler": "agentfly_jax.sampling.vllm_sampler",
  "BatchingScheduler": "agentfly_jax.sampling.batching",
  "PrefixStore": "agentfly_jax.sampling.prefix_cache",
  "logprob_mismatch_metrics": "agentfly_jax.sampling.mismatch",
  "sample_next_tokens": "agentfly_jax.sampling.next_token",
}


def __getattr__(name):
  if name in _LAZY:
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'agentfly_jax.sampling' has no attribute {name!r}")


__all__ = ["PromptImages", "Sampler", "SampleResult", "SamplingParams", "SyncStats", *_LAZY]
