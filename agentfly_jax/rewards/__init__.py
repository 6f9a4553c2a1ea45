"""Rewards: the `@reward` decorator and built-in rewards.

from agentfly_jax.rewards import reward, exact_match, f1, math_equal, numeric_match, get_reward
"""

from agentfly_jax.rewards.builtin import last_number, normalize_answer, numeric_match
from agentfly_jax.rewards.math import math_equal
from agentfly_jax.rewards.qa import exact_match, f1, normalize_squad
from agentfly_jax.rewards.registry import BUILTIN_REWARDS, get_reward, list_rewards, register_builtin_reward
from agentfly_jax.rewards.reward import Reward, normalize_reward, reward

__all__ = [
  "reward",
  "Reward",
  "normalize_reward",
  "exact_match",
  "f1",
  "math_equal",
  "numeric_match",
  "normalize_answer",
  "normalize_squad",
  "last_number",
  "get_reward",
  "list_rewards",
  "register_builtin_reward",
  "BUILTIN_REWARDS",
]
