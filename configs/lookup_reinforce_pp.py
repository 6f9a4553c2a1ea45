"""Lookup task (multi-turn: the answer needs a tool observation), reinforce_pp, tiny policy on CPU."""
from agentfly_jax.rl.config import default_config


def get_config():
  c = default_config()
  c.name = "lookup_reinforce_pp"
  c.task = "lookup"
  c.algo = "reinforce_pp"
  c.sft.steps = 150
  return c
