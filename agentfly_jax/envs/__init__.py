"""Trainer-side environments: the Env interface and the env-server resource manager.

from agentfly_jax.envs import default_provider
env = await default_provider().acquire("python_sandbox", chain_id="c0")
print((await env.step("print(6 * 7)")).observation)
"""

from agentfly_jax.envs.base import Env, EnvProvider, StepResult
from agentfly_jax.envs.local_server import LocalEnvServer, default_provider
from agentfly_jax.envs.manager import EnvManager, EnvUnavailable, RemoteEnv

__all__ = [
  "Env",
  "EnvManager",
  "EnvProvider",
  "EnvUnavailable",
  "LocalEnvServer",
  "RemoteEnv",
  "StepResult",
  "default_provider",
]
