"""Any OpenEnv environment server (the `openenv` env type on the env servers), grpo, tiny
random-init policy (CPU smoke size); on a GPU set model.pretrained and raise the sizes.

  .venv/bin/python experiments/train.py --config=configs/openenv_grpo.py --workdir=runs/openenv \
    --config.task.row_defaults.openenv_url=http://host:port   # or --config.task.row_defaults.openenv_app=my_module:app

The server's observations reach the agent as JSON text; its one tool `act` sends an action (a JSON
object of its fields, or text for a one-field action); reward: the episode's summed OpenEnv reward.
A URL where no OpenEnv server answers (or an app that does not import) stops the run before
training, naming it. The embedded local env server serves `openenv` (rows name the server).
Concurrent chains (rollout.rows_per_step x rollout.num_chains) each hold one OpenEnv session: keep
them within the server's max_concurrent_envs (a full server is an error saying so).
"""

from agentfly_jax.rl.config import world_config
from agentfly_jax.tasks.from_config import set_custom_task


def get_config():
  c = world_config("openenv", "grpo")
  # the rows' server (a row naming its own keeps it): both keys named, so each is a flag; set one
  server = {"openenv_url": "", "openenv_app": ""}
  set_custom_task(c, name="openenv", module="agentfly_jax.tasks.openenv", row_defaults=server)
  c.rollout.max_turns = 16
  return c
