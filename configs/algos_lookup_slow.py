"""The algorithm comparison (PPO, REINFORCE++, GRPO, RLOO: the AgentFly paper's table) on the lookup
task at a learning rate where the tiny policy does not saturate within the run: the shipped warm
start (experiments/results/lookup_warmstart), RL lr 1e-4 (lookup_grpo.py: 5e-4, dev success >= 0.89
by step 10 for every algorithm), 25 RL steps, counted checkpoint the last step (fixed before the runs).

  .venv/bin/python experiments/learning_report.py --config=configs/algos_lookup_slow.py \
      --algos=grpo,rloo,reinforce_pp,ppo --seeds=3

Re-chosen in the eighteenth session, when the warm start was rebuilt from the train keys only: the
recipe chosen below on the old warm start (lr 5e-5, 35 steps) left every algorithm's greedy policy
at 0.00-0.11 on dev and on the locked test at step 35 (seeds 1-3, all four algorithms, run as the
counted comparison before the re-choice; recorded in
experiments/results/lookup_split_leak/algos_lookup_slow_lr5e-5_rebuilt_warmstart.json). New GRPO
pilot, seed 0 (not counted), dev only, 40 steps, eval every 5 (pilot_*.metrics.jsonl there): lr 1e-4:
dev 0.00-0.02 at steps 0-20, 1.00 from step 25; lr 2e-4: 1.00 from step 15. Chosen by the rule used
before: the slower lr, and the step budget at the pilot's first dev eval at 1.00 (25).

How the first recipe was chosen, on the old warm start (one GRPO pilot seed, seed 0, which is not a counted seed: the counted seeds are
1, 2, 3; dev split only, `experiments/train.py`, 2-core CPU shared with a test suite, 2026-11-29):
  - multi-hop QA (task_config("multihop_qa"), random-init tiny policy + 100 SFT steps, 8 rows x 8
    chains, lr 3e-4): dev F1 0.000 after SFT, sampled reward 0.000 (std 0) at RL steps 1-2, ~3.5 min
    of SFT and 20-37 s a step: no reward for any algorithm to learn from; dropped.
  - arithmetic (random-init tiny policy + SFT 60 steps / tool_use_prob 0.4, 200 / 0.8, 400 / 1.0):
    dev success 0.000 after each SFT, sampled success 0.000 at every RL step run (1-4, 1-7, 1): the
    tiny policy does not learn to copy the numbers; dropped.
  - lookup from a random init + 100 SFT steps (tool_use_prob 1.0): dev 0.000 at steps 0-30, sampled
    success 0.00-0.08 (chance 1/32); dropped.
  - lookup from the shipped warm start: lr 1e-4: dev success 0.00, 0.05 (steps 5-15), 1.00 from step
    20; lr 5e-5: dev 0.00, 0.05 (steps 5-25), 0.00 (30), 1.00 at steps 35 and 40; ~1 s a step, 40
    steps 1.2 min of step time. Chosen: lr 5e-5 (the slower of the two: more steps before the greedy
    policy flips to calling the tool) and 35 steps (the pilot's first dev eval at 1.00: the budget
    sits at the one observed flip, not past it), eval every 5 steps.
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
  c.eval.counted_checkpoint = "last_within_budget"
  c.eval.budget_minutes = 0.0  # no wall-clock budget: the last step (35)
  c.checkpoint.every = 5
  return c
