"""Lookup task (multi-turn: the answer is only in the tool's observation), drgrpo, tiny policy, CPU."""

import os

from agentfly_jax.rl.config import lookup_config


def get_config():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return lookup_config("drgrpo", os.path.join(root, "experiments", "results", "lookup_warmstart"))
