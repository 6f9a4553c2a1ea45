"""Lookup task (multi-turn: the answer needs a tool observation), reinforce_pp_baseline, tiny policy on CPU."""
from agentfly_jax.rl.config import default_config


def get_config():
  c = default_config()
  c.name = "lookup_reinforce_pp_baseline"
  c.task = "lookup"
  c.algo = "reinforce_pp_baseline"
  c.sft.steps = 150
  return c
