"""Trio environment servers (no agentfly_jax, no JAX imports). Run: python -m envservers --port P --env NAME=POOL."""
