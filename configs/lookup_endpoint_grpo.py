"""The lookup task with GRPO, its agent a black box written only with the `openai` SDK
(agentfly_jax/tasks/lookup_agent.py) trained through the OpenAI-compatible endpoint over the
JAX sampler; the same warm-started tiny policy as configs/lookup_grpo.py.

  .venv/bin/python experiments/train.py --config=configs/lookup_endpoint_grpo.py --workdir=runs/ep
  ... --config.task.agent=my_module:run          # any agent: async def run(client, row) -> answer
"""

import os

from agentfly_jax.rl.config import lookup_config
from agentfly_jax.tasks.from_config import set_custom_task


def get_config():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  c = lookup_config("grpo", os.path.join(root, "experiments", "results", "lookup_warmstart"))
  c.name = "lookup_endpoint_grpo"
  set_custom_task(
    c, name="lookup_endpoint", module="agentfly_jax.tasks.lookup", agent="agentfly_jax.tasks.lookup_agent:run"
  )
  return c
