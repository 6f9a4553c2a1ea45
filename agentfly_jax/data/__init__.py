"""agentfly_jax.data."""
