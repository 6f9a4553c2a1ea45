"""Your own task (tools, a reward, JSON rows) with GRPO on a tiny random-init policy (CPU).

  .venv/bin/python experiments/train.py --config=configs/custom_grpo.py --workdir=runs/mine \
      --config.task.module=my_task                 # a module with @tool / @reward (+ ROWS)
  ... --config.task.train_path=rows.jsonl --config.task.eval_path=eval.jsonl \
      --config.task.tools=calculator,my_task:lookup --config.task.reward=exact_match

See agentfly_jax/tasks/from_config.py for what a task module may define. For a real model set
--config.model.pretrained=<HF folder>.
"""

from agentfly_jax.rl.config import default_config
from agentfly_jax.tasks.from_config import set_custom_task


def get_config():
  c = default_config()
  c.name = "custom_grpo"
  set_custom_task(c)
  c.algo = "grpo"
  c.train.steps = 20
  c.train.lr = 5e-4
  c.rollout.rows_per_step = 4
  c.rollout.num_chains = 4
  c.eval.every = 10
  c.eval.num_rows = 8
  return c
