"""Rewards by name: the built-ins, and user rewards as `module:function`.

get_reward("exact_match")              # a built-in
get_reward("my_pkg.my_task:my_reward") # a user's @reward (a plain function is wrapped)
list_rewards()
"""

from __future__ import annotations

from agentfly_jax.user_code import Listing

BUILTIN_REWARDS: dict[str, str] = {
  "exact_match": "agentfly_jax.rewards.qa:exact_match",
  "code_pass_rate": "agentfly_jax.rewards.code:code_pass_rate",
  "f1": "agentfly_jax.rewards.qa:f1",
  "math_equal": "agentfly_jax.rewards.math:math_equal",
  "numeric_match": "agentfly_jax.rewards.builtin:numeric_match",
  "scienceworld_score": "agentfly_jax.tasks.scienceworld:score_reward",
  "textworld_score": "agentfly_jax.tasks.textworld:score_reward",
  "webshop_purchase": "agentfly_jax.tasks.webshop:purchase_reward",
}


REWARDS = Listing("reward", BUILTIN_REWARDS)
register_builtin_reward = REWARDS.register
list_rewards = REWARDS.names


def get_reward(name: str):
  """The `Reward` named `name`: a built-in (see `list_rewards()`) or 'module:function'."""
  from agentfly_jax.rewards.reward import Reward

  obj = REWARDS.resolve(name)
  if isinstance(obj, Reward):
    return obj
  if callable(obj):
    return Reward(obj)
  raise ValueError(f"reward {name!r} is a {type(obj).__name__}, not a function")
