"""Lookup task (multi-turn: the answer is only in the tool's observation), ppo, tiny policy, CPU."""

import os

from agentfly_jax.rl.config import lookup_config


def get_config():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return lookup_config("ppo", os.path.join(root, "experiments", "results", "lookup_warmstart"))
