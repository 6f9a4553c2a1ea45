"""agentfly_jax.metrics."""
