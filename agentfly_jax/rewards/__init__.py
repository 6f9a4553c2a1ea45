"""Rewards: the `@reward` decorator and built-in rewards.

  from agentfly_jax.rewards import reward, exact_match, numeric_match
"""
from agentfly_jax.rewards.builtin import exact_match, last_number, normalize_answer, numeric_match
from agentfly_jax.rewards.registry import BUILTIN_REWARDS, get_reward, list_rewards, register_builtin_reward
from agentfly_jax.rewards.reward import Reward, normalize_reward, reward

__all__ = ["reward", "Reward", "normalize_reward", "exact_match", "numeric_match",
           "normalize_answer", "last_number", "get_reward", "list_rewards",
           "register_builtin_reward", "BUILTIN_REWARDS"]
