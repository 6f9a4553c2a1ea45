"""Helpers for the env-server tests: real servers as subprocesses on loopback."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess

import trio

from agentfly_jax.envs.local_server import LocalEnvServer
from envservers.client import Connection


@contextlib.contextmanager
def running_server(*envs: str, options: tuple[str, ...] = (), extra: tuple[str, ...] = ()):
  """Starts `python -m envservers --env ...` on a free loopback port; yields the LocalEnvServer."""
  server = LocalEnvServer(list(envs), list(options), extra_args=list(extra))
  try:
    yield server
  finally:
    server.stop()


async def connect(server: LocalEnvServer) -> Connection:
  return await Connection.open(server.address)


def restart_on_port(server: LocalEnvServer, *envs: str, extra: tuple[str, ...] = ()) -> LocalEnvServer:
  """A new server process on the (dead) `server`'s port; the caller stops it."""
  port = server.address.rsplit(":", 1)[1]
  return LocalEnvServer(list(envs), extra_args=["--port", port, *extra])


async def server_stats(address: str) -> dict:
  """The server's `stats` reply, on a connection of its own."""
  conn = await Connection.open(address, token=None)
  try:
    return await conn.call("stats", timeout_s=10)
  finally:
    await conn.aclose()


def steps_started(stats: dict, env: str = "sleep") -> int:
  """The `env` pool's calls beyond one `reset` per acquire: the steps started (a lower bound)."""
  pool = stats["pools"][env]
  return pool["calls"] - pool["acquires"]


async def busy(address: str, env: str = "sleep", steps_before: int = 0) -> bool:
  """Whether the server has a chain of `env` bound with a request in flight (besides this
  `stats` call) and more than `steps_before` steps started (see `steps_started`)."""
  stats = await server_stats(address)
  return stats["pools"][env]["in_use"] >= 1 and stats["inflight"] >= 2 and steps_started(stats, env) > steps_before


async def signal_when_busy(server: LocalEnvServer, sig: int = signal.SIGKILL, env: str = "sleep"):
  """Sends `sig` to the server once it has chains inside a call (see `busy`)."""
  await wait_until(lambda: busy(server.address, env), timeout_s=30, interval_s=0.02)
  kill(server.process.pid, sig)


def child_pids(pid: int) -> list[int]:
  """Direct children of `pid` (from /proc)."""
  children = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) == pid:
      children.append(int(entry))
  return children


def live_sandboxes(server_pid: int) -> int:
  """How many bwrap processes the server has as children right now."""
  count = 0
  for child in child_pids(server_pid):
    try:
      with open(f"/proc/{child}/cmdline", "rb") as f:
        if f.read().split(b"\0")[0].endswith(b"bwrap"):
          count += 1
    except OSError:
      pass
  return count


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
  with contextlib.suppress(ProcessLookupError):
    os.kill(pid, sig)


async def process_ended(pid: int) -> bool:
  """True once `pid` is gone or a zombie (killed, not yet reaped by its parent): a kill has landed."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
  except OSError:
    return True


async def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.05):
  with trio.fail_after(timeout_s):
    while True:
      value = await predicate()
      if value:
        return value
      await trio.sleep(interval_s)


# bwrap's words when the kernel or a policy refuses it the namespaces it needs.
_NAMESPACE_REFUSED = (
  "no permissions to create",
  "creating new namespace failed",
  "setting up uid map",
  "unshare failed",
  "operation not permitted",
  "user namespaces",
  "permission denied",
)


@functools.cache
def sandbox_unavailable_reason() -> str | None:
  """Why sandbox tests must skip here: bubblewrap is absent, or user namespaces are refused (a
  bare `bwrap --unshare-all ... true` fails saying so). None otherwise: any other failure of the
  sandbox code (bwrap.py, the drivers) is a bug that must fail the tests, not skip them."""
  from envservers.envs.bwrap import BWRAP

  if not os.path.exists(BWRAP):
    return f"bubblewrap ({BWRAP}) is not installed (.ci/setup installs it)"
  done = subprocess.run(
    [BWRAP, "--unshare-all", "--ro-bind", "/", "/", "--", "/bin/true"], capture_output=True, text=True, timeout=60
  )
  words = done.stderr.strip().lower()
  if done.returncode != 0 and any(w in words for w in _NAMESPACE_REFUSED):
    return f"bubblewrap cannot create its namespaces here (user namespaces refused): {done.stderr.strip()}"
  return None
