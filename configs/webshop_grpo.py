"""webshop (interactive world on the env servers), grpo, tiny random-init policy (CPU smoke size)."""

from agentfly_jax.rl.config import world_config


def get_config():
  return world_config("webshop", "grpo")
