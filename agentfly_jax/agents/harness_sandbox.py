"""The bubblewrap sandbox of one outside harness (agents/harness.py), and its one way out.

  mounts = harness_mounts(words, extra=("/path/to/my/agent",))
  async with chain_bridge(endpoint_port, source_host) as socket_dir:    # the trainer's end
    args = sandbox_command(words, env=env, socket_dir=socket_dir, port=endpoint_port, mounts=mounts)

The walls are the SWE env's (envservers/envs/bwrap.py): private PID, IPC, UTS, cgroup and network
namespaces (`--unshare-all`), every capability dropped, `--die-with-parent`, `--new-session`; the host's
/usr (+ /bin, /lib*, the loader cache, the time zone) and nothing else but what the harness needs, all
read-only: the prefix of its program (a venv and the interpreter it was made from), the folders of the
command's path arguments, the folders the user names (`task.agent_mounts`); the envservers package's
data (the SWE and Harbor tasks' hidden tests and fixes) sealed under an empty tmpfs wherever one of
those exposes it (the package's code stays: a harness may import agentfly_jax, which imports it); a
private /proc (no other chain's process, so no other chain's key, is visible), a size-capped tmpfs /tmp
(also HOME); the working directory as on the host, empty but for mounts under it; a cleared
environment holding only what the harness is given.

The network namespace has only loopback: harness_net.py listens there on the endpoint's port and carries
each connection through a Unix socket, the one path out, to `chain_bridge`, which connects to the endpoint
from a loopback address of the chain's own (127.x.y.z); the endpoint takes the chain's key only from that
address (`ChatEndpoint.bind_chain`), so a key used from another sandbox, or from the host, is refused.

The harness runs as the trainer's user, without capabilities; what it can read is what is mounted. Unlike
the SWE env's sandboxes it gets no rlimits and no memory cgroup: its CPU, memory and process count are the
trainer user's.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import sys
import tempfile
from typing import Sequence

import trio

BWRAP = "/usr/bin/bwrap"
SANDBOX_TMP_MB = 256  # the writable /tmp (and HOME) of a harness's sandbox
SOCKET_IN_SANDBOX = "/run/agentfly/endpoint.sock"
NET_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness_net.py")
_hosts = itertools.count()


def check_sandbox(where: str) -> None:
  """ValueError naming `where` when bubblewrap is missing."""
  if not os.path.exists(BWRAP):
    raise ValueError(
      f"{where}: harnesses run in a bubblewrap sandbox and {BWRAP} is not installed (Debian package "
      "'bubblewrap'; .ci/setup installs it), or set agent_sandbox='off' to run them unsandboxed"
    )


def source_host() -> str:
  """A loopback address of a chain's own (127.c.b.a, never 127.0.0.1), new on every call in this process."""
  n = next(_hosts)
  return f"127.{1 + (n // (254 * 256)) % 254}.{(n // 254) % 256}.{n % 254 + 1}"


def _prefix(path: str) -> str | None:
  """The installation prefix of a program (two folders up: .../bin/prog -> ...), unless it is the host's /usr."""
  prefix = os.path.dirname(os.path.dirname(path))
  return None if prefix in ("", "/") or prefix == "/usr" or prefix.startswith("/usr/") else prefix


def harness_mounts(words: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
  """The host folders a harness's sandbox shows it, read-only: its program's prefix (as named and as resolved:
  a venv and its base interpreter), the forwarder's interpreter, the folder of every path argument, `extra`."""
  program = shutil.which(words[0]) or words[0]
  found = []
  for path in (os.path.abspath(program), os.path.realpath(program), sys.executable, os.path.realpath(sys.executable)):
    found.append(_prefix(path))
  for word in words[1:]:
    if os.path.isfile(word):
      found.append(os.path.dirname(os.path.abspath(word)))
    elif os.path.isdir(word):
      found.append(os.path.abspath(word))
  for folder in extra:
    if not os.path.isdir(folder):
      raise ValueError(f"agent_mounts: {folder!r} is not a folder")
    found.append(os.path.abspath(folder))
  return list(dict.fromkeys(p for p in found if p))


def sandbox_command(
  words: Sequence[str],
  *,
  env: dict[str, str],
  socket_dir: str,
  port: int,
  mounts: Sequence[str],
  tmp_mb: int = SANDBOX_TMP_MB,
) -> list[str]:
  """The bwrap command line running `words` in a harness sandbox (module docstring) with exactly `env`."""
  args = [BWRAP, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
  args += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
  for top in ("/bin", "/lib", "/lib64", "/sbin"):
    if os.path.islink(top):
      args += ["--symlink", os.readlink(top), top]
    elif os.path.isdir(top):
      args += ["--ro-bind", top, top]
  for path in ("/etc/ld.so.cache", "/etc/localtime"):
    if os.path.exists(path):
      args += ["--ro-bind", path, path]
  for folder in mounts:
    args += ["--ro-bind", folder, folder]
  args += seal_args(mounts)
  args += ["--ro-bind", socket_dir, os.path.dirname(SOCKET_IN_SANDBOX)]
  cwd = os.getcwd()
  args += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_mb << 20), "--tmpfs", "/tmp"]
  args += ["--dir", cwd, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", cwd, "--clearenv"]
  program = shutil.which(words[0]) or words[0]
  env = {"PATH": f"{os.path.dirname(os.path.abspath(program))}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", **env}
  for key, value in env.items():
    args += ["--setenv", key, value]
  with open(NET_SOURCE) as f:
    net = f.read()
  forwarder = [sys.executable, "-I", "-S", "-c", net, SOCKET_IN_SANDBOX, str(port), "--"]
  return args + ["--", *forwarder, os.path.abspath(program), *words[1:]]


def sealed_data() -> str:
  """The envservers package's data folder (its SWE / Harbor tasks' hidden tests and fixes)."""
  import importlib.util

  spec = importlib.util.find_spec("envservers")
  return os.path.realpath(os.path.join(os.path.dirname(spec.origin), "data"))


def seal_args(mounts: Sequence[str]) -> list[str]:
  """Mount options laying an empty read-only tmpfs over the envservers data wherever a mount exposes it."""
  sealed, out = sealed_data(), []
  for folder in mounts:
    real = os.path.realpath(folder)
    if sealed == real or sealed.startswith(real.rstrip("/") + "/"):
      inside = os.path.join(folder, os.path.relpath(sealed, real))
      out += ["--size", "4096", "--tmpfs", inside, "--remount-ro", inside]
  return out


async def _pump(source, sink) -> None:
  try:
    while data := await source.receive_some(65536):
      await sink.send_all(data)
    await sink.send_eof()
  except (trio.BrokenResourceError, trio.ClosedResourceError):
    pass


@contextlib.asynccontextmanager
async def chain_bridge(port: int, host: str):
  """The trainer's end of a sandbox's way out: a Unix socket in a new folder (yielded: that folder; the
  socket is `endpoint.sock` in it) whose every connection is carried to 127.0.0.1:`port` from the source
  address `host`. Closed, with every connection, on exit."""
  with tempfile.TemporaryDirectory(prefix="agentfly-harness-") as folder:
    path = os.path.join(folder, os.path.basename(SOCKET_IN_SANDBOX))
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(path)
    listener.listen(64)

    async def carry(stream):
      async with stream:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
          await sock.bind((host, 0))
          await sock.connect(("127.0.0.1", port))
        except OSError:
          sock.close()
          return
        async with trio.SocketStream(sock) as tcp, trio.open_nursery() as nursery:
          nursery.start_soon(_pump, stream, tcp)
          await _pump(tcp, stream)

    async with trio.open_nursery() as nursery:
      nursery.start_soon(trio.serve_listeners, carry, [trio.SocketListener(listener)])
      try:
        yield folder
      finally:
        nursery.cancel_scope.cancel()
