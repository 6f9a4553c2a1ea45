"""The algorithm comparison (PPO, REINFORCE++, GRPO, RLOO: the AgentFly paper's table) on the lookup
task at a learning rate where the tiny policy does not saturate within the run: the shipped warm
start (experiments/results/lookup_warmstart), RL lr 1e-4 (lookup_grpo.py: 5e-4, dev success >= 0.89
by step 10 for every algorithm), 25 RL steps, counted checkpoint the last step (fixed before the runs).

  .venv/bin/python experiments/learning_report.py --config=configs/algos_lookup_slow.py \
      --algos=grpo,rloo,reinforce_pp,ppo --seeds=3

The lr and the step budget were chosen on dev-split pilots of seed 0 (not a counted seed): the slower
of two learning rates that flip the greedy policy to the tool, and the budget at the pilot's first dev
eval at 1.00. The pilots and the recipe they replaced: lab/results/learning/algos_lookup_slow_pilots.md.

Greedy success on lookup is close to all-or-nothing per run (the greedy policy either calls the tool
for every key or for none), so the locked-test score of a run says whether it flipped by the last step.
"""

import os

from agentfly_jax.rl.config import lookup_config


def get_config(algo: str = "grpo"):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  c = lookup_config(algo or "grpo", os.path.join(root, "experiments", "results", "lookup_warmstart"))
  c.name = f"algos_lookup_slow_{c.algo}"  # learning_report --algos: reports algos_lookup_slow_<algo>
  c.seed = 1  # counted seeds 1, 2, 3 (the pilot was seed 0)
  c.train.lr = 1e-4
  c.train.steps = 25
  c.eval.every = 5
  c.eval.budget_minutes = 0.0  # no wall-clock budget: the last step (35)
  c.checkpoint.every = 5
  return c
