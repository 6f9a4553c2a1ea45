"""The env-type registry: name -> `ServerEnv` class, and the factories the server's pools use.

    from envservers.registry import register_env

    @register_env
    class MyWorld(BlockingEnv):
      name = "my_world"

`python -m envservers --env my_world=4` then serves it (built-ins register when
`envservers.envs` is imported; user modules with `--import MODULE`).
"""

from __future__ import annotations

from typing import Any, Callable

from envservers.env import ServerEnv
from envservers.subprocess_env import SubprocessEnv

ENV_TYPES: dict[str, type[ServerEnv]] = {}


def register_env(cls: type[ServerEnv]) -> type[ServerEnv]:
  """Class decorator: makes `cls` available as `--env <cls.name>=N`."""
  if not cls.name:
    raise ValueError(f"env class {cls.__qualname__} has no `name`")
  if cls.name in ENV_TYPES and ENV_TYPES[cls.name] is not cls:
    raise ValueError(f"env name {cls.name!r} is already registered by {ENV_TYPES[cls.name]}")
  ENV_TYPES[cls.name] = cls
  return cls


def get_env_type(env_name: str) -> type[ServerEnv]:
  """The class registered as `env_name`; KeyError listing the known names."""
  if env_name not in ENV_TYPES:
    raise KeyError(f"unknown env type {env_name!r}; known: {sorted(ENV_TYPES)}")
  return ENV_TYPES[env_name]


def make_factory(env_name: str, options: dict[str, Any]) -> Callable[[], ServerEnv]:
  """Returns a zero-argument constructor for env type `env_name` with its options.

  Options are checked now (constructors must be cheap; slow set-up belongs in `start`).
  """
  cls = get_env_type(env_name)
  cls(**options)
  if getattr(cls, "run_in_subprocess", False):
    return lambda: SubprocessEnv(cls, options)
  return lambda: cls(**options)
