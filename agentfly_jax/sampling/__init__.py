"""Samplers: the protocol, the JAX sampler, the vLLM sampler, weight sync."""
from agentfly_jax.sampling.protocol import Sampler, SampleResult, SamplingParams

__all__ = ["Sampler", "SampleResult", "SamplingParams"]
