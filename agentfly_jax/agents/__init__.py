"""agentfly_jax.agents."""
