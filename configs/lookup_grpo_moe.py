"""Lookup task, grpo, a tiny mixture-of-experts policy (Qwen3-MoE, 4 experts of width 128, top 2: the
dense warm start's active MLP width) from its own shipped warm start, trained on the paged engine's
recorded routes (router replay), CPU."""

import os

from agentfly_jax.rl.config import lookup_config


def get_config():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  c = lookup_config("grpo", os.path.join(root, "experiments", "results", "lookup_warmstart_moe"))
  c.name = "lookup_grpo_moe"
  c.model.router_replay = "rollout"  # the train step routes each token as the sampler did
  c.loss.router_aux_coef = 0.001  # HF Qwen3-MoE's router_aux_loss_coef
  return c
