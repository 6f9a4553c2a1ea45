"""Trio environment servers (imports nothing of agentfly_jax and no JAX).

Run one: `python -m envservers --host 127.0.0.1 --port 8765 --env python_sandbox=16 --env echo=4`.
Wire protocol: PROTOCOL.md. Write an env type: subclass `ServerEnv` (async) or `BlockingEnv`
(blocking methods run in worker threads), decorate with `@register_env`, declare env-bound
rewards with `@env_reward`.
"""

from envservers.env import BlockingEnv, EnvCrashed, ServerEnv, StepOutcome, env_reward, reward_dict
from envservers.registry import ENV_TYPES, register_env
from envservers.protocol import RemoteError, encode_frame, parse_address
from envservers.server import EnvServer

__all__ = [
  "ENV_TYPES",
  "BlockingEnv",
  "EnvCrashed",
  "EnvServer",
  "RemoteError",
  "ServerEnv",
  "StepOutcome",
  "encode_frame",
  "env_reward",
  "parse_address",
  "register_env",
  "reward_dict",
]
