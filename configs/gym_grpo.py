"""Any Gymnasium environment (the `gymnasium` env type on the env servers), grpo, tiny random-init
policy (CPU smoke size); on a GPU set model.pretrained and raise the sizes.

  .venv/bin/python experiments/train.py --config=configs/gym_grpo.py --workdir=runs/gym
  ... --config.task.row_defaults.gym_id=my_module:MyTextEnv-v0    # any registered id; 'module:' imports it

The env's observations reach the agent as text (non-text ones as JSON); its one tool `act` sends
an action as text (Discrete: an integer); reward: the episode's summed env reward. A gym id that
does not exist stops the run before training, naming it. The env server needs
`--env gymnasium=N` (the embedded local server serves it).
"""

from agentfly_jax.rl.config import world_config
from agentfly_jax.tasks.from_config import set_custom_task


def get_config():
  c = world_config("gym", "grpo")
  set_custom_task(c, name="gym", module="agentfly_jax.tasks.gym", row_defaults={"gym_id": "CliffWalking-v1"})
  c.rollout.max_turns = 16
  return c
