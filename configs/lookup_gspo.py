"""Lookup task (multi-turn: the answer needs a tool observation), gspo, tiny policy on CPU.

Starts from the shipped warm start (experiments/make_warmstart.py: tiny tokenizer + SFT on
scripted demonstrations that use the tool 30% of the time).
"""
import os

from agentfly_jax.rl.config import default_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config():
  c = default_config()
  c.name = "lookup_gspo"
  c.task = "lookup"
  c.algo = "gspo"
  c.model.pretrained = os.path.join(ROOT, "experiments", "results", "lookup_warmstart")
  c.sft.steps = 0
  c.train.steps = 40
  c.train.lr = 5e-4
  return c
