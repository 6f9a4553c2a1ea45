"""On-policy distillation on the lookup task: the student is the shipped warm start (greedy dev/test success 0.00),
the teacher the lookup_grpo recipe's trained policy (experiments/results/lookup_teacher, made by
experiments/make_lookup_teacher.py over the warm start's tokenizer), every other setting RL alone's slow recipe
(configs/algos_lookup_slow.py: lr 1e-4, 25 steps, eval every 5, counted checkpoint the last step, seeds 1-3), so
its row beside algos_lookup_slow_grpo in LEARNING.md compares distillation with RL alone from the same start.

  .venv/bin/python experiments/learning_report.py --config=configs/distill_lookup_slow.py --seeds=3

`config.loss.distill_weight`: 1.0 = the teacher's per-token reverse KL alone as the advantage (the reward still
logged); a flag `--config.loss.distill_weight=0.5` mixes it with GRPO's advantages.
"""

import os

from agentfly_jax.rl.config import lookup_config


def get_config(weight: str = "1.0"):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  results = os.path.join(root, "experiments", "results")
  c = lookup_config("grpo", os.path.join(results, "lookup_warmstart"))
  c.name = "distill_lookup_slow"
  c.seed = 1  # counted seeds 1, 2, 3 (as algos_lookup_slow's)
  c.train.lr = 1e-4
  c.train.steps = 25
  c.eval.every = 5
  c.eval.budget_minutes = 0.0
  c.checkpoint.every = 5
  c.teacher.pretrained = os.path.join(results, "lookup_teacher")
  c.loss.distill_weight = float(weight or 1.0)
  return c
