"""Harbor-format tasks (Terminal-Bench 2.0 task directories) on the swe env's bubblewrap
sandbox, grpo, tiny random-init policy (CPU smoke size); on a GPU set model.pretrained and raise
the sizes.

  .venv/bin/python experiments/train.py --config=configs/harbor_grpo.py --workdir=runs/harbor
  ... --config.task.train_path=rows.jsonl    # rows {"question": ..., "harbor_task": "/abs/task-dir"}

A task dir: instruction.md, task.toml, environment/ (its files: the repository at /repo),
tests/test.sh (the reward: /logs/verifier/reward.txt, else its exit code; the tests sit at
/tests in the grading sandbox only), solution/ (never sent). Without rows: the examples in
envservers/data/harbor_tasks. A task without tests/test.sh, or one that needs its own container
image (task.toml environment.docker_image, environment/Dockerfile), stops the run before
training, naming the task and the field. The env server needs `--env swe=N`.
"""

from agentfly_jax.rl.config import world_config
from agentfly_jax.tasks.from_config import set_custom_task


def get_config():
  c = world_config("harbor", "grpo")
  set_custom_task(c, name="harbor", module="agentfly_jax.tasks.harbor")
  c.rollout.max_turns = 8
  c.rollout.max_tokens_per_turn = 96
  c.rollout.max_total_tokens = 3072
  c.eval.num_rows = 2
  return c
