"""Generated math problems that need computation: `code_interpreter` + `answer`, reward
math_equal (math-verify); a random-init tiny policy on CPU. Any algorithm:
`--config=configs/math_grpo.py:ppo` (or `--config.algo=rloo`)."""

from agentfly_jax.rl.config import task_config


def get_config(algo: str = "grpo"):
  return task_config("math_calc", algo or "grpo", **{"rollout.max_turns": 3})
