"""Lookup task (multi-turn: the answer needs a tool observation), grpo, tiny policy on CPU."""
from agentfly_jax.rl.config import default_config


def get_config():
  c = default_config()
  c.name = "lookup_grpo"
  c.task = "lookup"
  c.algo = "grpo"
  c.sft.steps = 150
  return c
