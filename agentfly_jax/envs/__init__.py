"""Trainer-side environments: the Env interface and the env-server resource manager."""
from agentfly_jax.envs.base import Env, EnvProvider, StepResult

__all__ = ["Env", "EnvProvider", "StepResult"]
