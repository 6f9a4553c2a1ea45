"""agentfly_jax.models."""
