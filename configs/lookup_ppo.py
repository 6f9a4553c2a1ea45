"""Lookup task (multi-turn: the answer needs a tool observation), ppo, tiny policy on CPU."""
from agentfly_jax.rl.config import default_config


def get_config():
  c = default_config()
  c.name = "lookup_ppo"
  c.task = "lookup"
  c.algo = "ppo"
  c.sft.steps = 150
  return c
