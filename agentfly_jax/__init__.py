"""agentfly-jax: JAX-native multi-turn RL for tool-using LLM agents.

from agentfly_jax import tool, reward
"""

__version__ = "0.1.0"

from agentfly_jax.xla_defaults import apply_default_xla_flags as _apply_default_xla_flags

_apply_default_xla_flags()  # measured XLA defaults (xla_defaults.py), before JAX's backend starts


def __getattr__(name):  # lazy, so `import agentfly_jax` stays light (no JAX import)
  if name == "tool":
    from agentfly_jax.tools import tool

    return tool
  if name == "reward":
    from agentfly_jax.rewards import reward

    return reward
  raise AttributeError(f"module 'agentfly_jax' has no attribute {name!r}")


__all__ = ["tool", "reward", "__version__"]
