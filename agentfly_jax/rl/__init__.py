"""agentfly_jax.rl: the RL math (advantage estimators, losses); trainer modules join later.

    from agentfly_jax.rl import advantages, losses
"""
from agentfly_jax.rl import advantages, losses

__all__ = ["advantages", "losses"]
