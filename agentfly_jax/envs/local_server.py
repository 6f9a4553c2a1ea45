"""An env server started by this process (the embedded default), and `default_provider()`.

`default_provider()` returns one process-wide `EnvManager`: for the servers listed in
`AGENTFLY_ENV_SERVERS=host:port,...`, or, with none configured, for a local server it starts
itself (`python -m envservers` on a free loopback port; it exits when this process exits, even
on a crash, because it watches its stdin pipe). So a notebook or a one-off tool call needs no
set-up. The local server's env types come from `AGENTFLY_LOCAL_ENVS` (default
DEFAULT_LOCAL_ENVS: the tools' sandboxes and every world a built-in config uses, visual_qa included; the worlds
start no instance until a chain asks for one).
"""

from __future__ import annotations

import atexit
import os
import select
import subprocess
import sys
import threading
import time

import envservers
from agentfly_jax.envs.manager import EnvManager

DEFAULT_LOCAL_ENVS = (
  "python_sandbox=16:2,retrieval=16:1,echo=8:1,counter=8:1,sleep=64:1,webshop=32:0,"
  "textworld=16:0,scienceworld=4:0,swe=16:0,gymnasium=16:0,openenv=16:0,visual_qa=16:0"
)


class LocalEnvServer:
  """A `python -m envservers` child process on 127.0.0.1 (a free port chosen by the server).

  Args:
    envs: specs NAME=CAP[:WARM].
    env_options: extra `--env-opt NAME.KEY=VALUE` strings.
    start_timeout_s: how long to wait for its ready line.
  """

  def __init__(
    self, envs: list[str], env_options: list[str] = (), start_timeout_s: float = 60.0, extra_args: list[str] = ()
  ):
    command = [sys.executable, "-m", "envservers", "--host", "127.0.0.1", "--port", "0", "--exit-on-stdin-eof"]
    for spec in envs:
      command += ["--env", spec]
    for spec in env_options:
      command += ["--env-opt", spec]
    command += list(extra_args)
    self.command = command
    # The child must find `envservers` even when it is not installed (e.g. a repo on this process's
    # sys.path): the child's PYTHONPATH names the package root; this process's sys.path is not changed.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(envservers.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    self.process = subprocess.Popen(
      command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, start_new_session=True, env=env
    )
    self.address = self._wait_ready(start_timeout_s)

  def _wait_ready(self, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n"):
      remaining = deadline - time.monotonic()
      if remaining <= 0 or self.process.poll() is not None:
        self.stop()
        raise RuntimeError(
          f"local env server did not start (exit status "
          f"{self.process.returncode}; "
          f"command: {' '.join(self.command[:4])} ...); see its stderr above"
        )
      ready, _, _ = select.select([self.process.stdout], [], [], min(remaining, 0.5))
      if ready:
        chunk = os.read(self.process.stdout.fileno(), 1024)
        if not chunk:
          continue
        line += chunk
    text = line.decode().strip()
    if not text.startswith("envservers listening on "):
      self.stop()
      raise RuntimeError(f"local env server printed {text!r} instead of its ready line")
    return text.rsplit(" ", 1)[-1]

  def stop(self, timeout_s: float = 10.0) -> None:
    """SIGTERM (graceful), then SIGKILL if it does not exit in time."""
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(timeout_s)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    for stream in (self.process.stdin, self.process.stdout):
      if stream is not None:
        stream.close()


_lock = threading.Lock()
_default: EnvManager | None = None
_local_server: LocalEnvServer | None = None


def default_provider() -> EnvManager:
  """The process-wide EnvManager (env servers from AGENTFLY_ENV_SERVERS, or a local one)."""
  global _default, _local_server
  with _lock:
    if _default is None:
      servers = os.environ.get("AGENTFLY_ENV_SERVERS", "").strip()
      if servers:
        _default = EnvManager([s.strip() for s in servers.split(",") if s.strip()])
      else:
        envs = os.environ.get("AGENTFLY_LOCAL_ENVS", DEFAULT_LOCAL_ENVS)
        _local_server = LocalEnvServer([e.strip() for e in envs.split(",") if e.strip()])
        atexit.register(_stop_local_server, os.getpid())
        _default = EnvManager([_local_server.address])
    return _default


def current_default() -> EnvManager | None:
  """The process-wide EnvManager if `default_provider()` made one, else None (never creates)."""
  return _default


def _stop_local_server(owner_pid: int) -> None:
  global _default, _local_server
  if os.getpid() != owner_pid:  # a forked child exiting must not stop its parent's server
    return
  with _lock:
    if _local_server is not None:
      _local_server.stop()
    _local_server = None
    _default = None
