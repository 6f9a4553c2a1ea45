"""Lookup task (multi-turn: the answer needs a tool observation), drgrpo, tiny policy on CPU."""
from agentfly_jax.rl.config import default_config


def get_config():
  c = default_config()
  c.name = "lookup_drgrpo"
  c.task = "lookup"
  c.algo = "drgrpo"
  c.sft.steps = 150
  return c
