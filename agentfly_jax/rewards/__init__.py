"""agentfly_jax.rewards."""
