"""The rollout engine: continuous batching over a paged KV cache (PagedJaxSampler) and its parts."""

from agentfly_jax.sampling.engine.pages import PagePool
from agentfly_jax.sampling.engine.paged_sampler import PagedJaxSampler
from agentfly_jax.sampling.engine.scheduler import Engine, EngineConfig

__all__ = ["Engine", "EngineConfig", "PagePool", "PagedJaxSampler"]
