"""agentfly_jax.rl."""
