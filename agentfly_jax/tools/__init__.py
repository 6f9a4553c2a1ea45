"""agentfly_jax.tools."""
