"""Multi-hop QA over the generated knowledge base: `retrieve` + `answer`, reward f1 (SQuAD token
F1 against the gold aliases); a random-init tiny policy on CPU. Any algorithm:
`--config=configs/search_grpo.py:ppo` (or `--config.algo=rloo`)."""

from agentfly_jax.rl.config import task_config


def get_config(algo: str = "grpo"):
  return task_config("multihop_qa", algo or "grpo", **{"rollout.max_turns": 4})
