"""Lookup task (multi-turn: the answer needs a tool observation), rloo, tiny policy on CPU."""
from agentfly_jax.rl.config import default_config


def get_config():
  c = default_config()
  c.name = "lookup_rloo"
  c.task = "lookup"
  c.algo = "rloo"
  c.sft.steps = 150
  return c
