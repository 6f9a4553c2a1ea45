"""Which EnvProvider serves stateful tools and env-bound rewards: one home for the choice.

    provider = get_env_provider(rollout_arg, agent.env_provider)   # first non-None, else the default
    set_env_provider(my_provider)        # what direct (out-of-rollout) tool calls use; None resets
    provider = DeferredEnvProvider()     # the trainer's handle: resolves on first use, never earlier

The default is `local_server.default_provider()`: env servers from AGENTFLY_ENV_SERVERS, else an
embedded local env server, started only when a chain first needs an environment.
"""

from __future__ import annotations

from typing import Any

from agentfly_jax.envs import local_server

_override = None


def set_env_provider(provider) -> None:
  """Sets the EnvProvider that calls without one of their own use; None resets to the default."""
  global _override
  _override = provider


def get_env_provider(*preferred):
  """The first non-None of `preferred` (e.g. a rollout's `env_provider=` argument, then the
  agent's), else the one set by `set_env_provider`, else the process default (created here)."""
  for provider in preferred:
    if provider is not None:
      return provider
  if _override is not None:
    return _override
  return local_server.default_provider()


def current_env_provider(*preferred):
  """As `get_env_provider`, but never creates the default: None when nothing was made yet."""
  for provider in preferred:
    if provider is not None:
      return provider
  return _override if _override is not None else local_server.current_default()


class DeferredEnvProvider:
  """An EnvProvider that resolves `get_env_provider(*preferred)` on its first acquire, so a run
  whose chains never need an environment starts no env server. `resolved` is the provider it
  forwards to (None before first use); `current()` the provider to report on, if any."""

  def __init__(self, *preferred):
    self._preferred = preferred
    self.resolved = None

  def _get(self):
    if self.resolved is None:
      self.resolved = get_env_provider(*self._preferred)
    return self.resolved

  def current(self):
    return self.resolved if self.resolved is not None else current_env_provider(*self._preferred)

  async def acquire(self, env_name: str, chain_id: str) -> Any:
    return await self._get().acquire(env_name, chain_id)

  async def release(self, env_name: str, chain_id: str) -> None:
    await self._get().release(env_name, chain_id)

  def __getattr__(self, name: str):  # other provider methods (env_types, close, ...) forward
    if name.startswith("_") or name in ("resolved",):
      raise AttributeError(name)
    return getattr(self._get(), name)
