"""The bubblewrap walls the sandboxed env types share (`python_sandbox`, `swe`).

`bwrap_args` builds the command line: no network and private IPC/PID/UTS/cgroup namespaces
(`--unshare-all`), `--die-with-parent`, `--new-session` (no terminal injection); a read-only /usr
(the system Python and its libraries) and nothing else of the host but the loader cache, the time
zone and the sandbox interpreter's prefix (plus, on request, the server venv's packages read-only
at /opt/site-packages), with the envservers package itself hidden under an empty read-only tmpfs
wherever a mount would expose it (`seal_args`: its data holds the SWE hidden tests and bugs); the writable places only the size-capped tmpfs mounts asked for (bwrap's
own /dev is an uncapped tmpfs: it is made read-only, device nodes keep working); a cleared
environment. The driver inside sets the rlimits. `BwrapProcess` is the host side of one such
process: started with a uid of its own when the server runs as root (so RLIMIT_NPROC holds per
sandbox and root-only files stay unreadable, even through /proc) and no host environment, moved
into a memory cgroup where the server may make one, stopped with everything inside.
"""

from __future__ import annotations

import functools
import itertools
import os
import pathlib
import subprocess
import sys
import sysconfig
from typing import Any

import trio

from envservers.env import EnvCrashed
from envservers.envs import memory_cgroup
from envservers.process import StderrCapture, kill_process

BWRAP = "/usr/bin/bwrap"
SITE_PACKAGES = "/opt/site-packages"
_uid_counter = itertools.count()
_HERE = pathlib.Path(__file__).parent
_INLINED_IMPORT = "from envservers.envs.driver_common import "


def driver_source(file_name: str) -> str:
  """The source of a driver in this folder, run as `python -c` inside a sandbox (no envservers
  package there): its one `from envservers.envs.driver_common import ...` line replaced by
  driver_common.py itself."""
  lines = (_HERE / file_name).read_text().splitlines(keepends=True)
  at = [i for i, line in enumerate(lines) if line.startswith(_INLINED_IMPORT)]
  if len(at) != 1:
    raise RuntimeError(
      f"{file_name} must import driver_common in exactly one line ({_INLINED_IMPORT}...), found {len(at)}"
    )
  lines[at[0]] = (_HERE / "driver_common.py").read_text()
  return "".join(lines)


@functools.lru_cache(maxsize=None)
def _python_version(python: str) -> str:
  return subprocess.run(
    [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
    capture_output=True,
    text=True,
    timeout=30,
    check=True,
  ).stdout.strip()


def default_python() -> str:
  """The sandbox interpreter: the system Python, else this one."""
  if os.path.exists("/usr/bin/python3"):
    return "/usr/bin/python3"
  return os.path.realpath(sys.executable)


def host_site_packages(python: str) -> str | None:
  """The server venv's site-packages, if the sandbox Python can use it (same major.minor)."""
  if sys.prefix == sys.base_prefix:
    return None
  purelib = sysconfig.get_paths()["purelib"]
  try:
    same = _python_version(python) == "%d.%d" % sys.version_info[:2]
  except (OSError, subprocess.SubprocessError):
    return None
  return purelib if same and os.path.isdir(purelib) else None


def bwrap_args(
  python: str,
  command: list[str],
  *,
  env: dict[str, str],
  tmpfs: list[tuple[str, int]],
  chdir: str,
  site_packages: bool,
  pythonpath: tuple[str, ...] = (),
  mounts: tuple[str, ...] = (),
  as_pid_1: bool = False,
) -> list[str]:
  """The bwrap command line running `command` (see the module docstring).

  Args:
    python: the sandbox interpreter (its prefix is bound read-only when outside /usr).
    command: what runs inside, after `--`.
    env: the sandbox's environment (PYTHONPATH set here from `pythonpath` and the venv's
      packages when `site_packages` and the interpreter can use them).
    tmpfs: (mount point, size in MiB) of each writable tmpfs, in mount order.
    chdir: the working directory inside.
    mounts: more bwrap mount options, after the host's and before /proc.
    as_pid_1: `command` is the namespace's init (which `kill -9 -1` inside cannot reach).
  """
  args = [
    BWRAP,
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    *(["--as-pid-1"] if as_pid_1 else []),
    "--hostname",
    "sandbox",
    "--ro-bind",
    "/usr",
    "/usr",
  ]
  for top in ("/bin", "/lib", "/lib64", "/sbin"):
    if os.path.islink(top):
      args += ["--symlink", os.readlink(top), top]
    elif os.path.isdir(top):
      args += ["--ro-bind", top, top]
  for path in ("/etc/ld.so.cache", "/etc/localtime"):
    if os.path.exists(path):
      args += ["--ro-bind", path, path]
  python_real = os.path.realpath(python)
  if not python_real.startswith("/usr/"):
    prefix = os.path.dirname(os.path.dirname(python_real))
    args += ["--ro-bind", prefix, prefix]
  paths = list(pythonpath)
  site = host_site_packages(python) if site_packages else None
  if site:
    args += ["--ro-bind", site, SITE_PACKAGES]
    paths.append(SITE_PACKAGES)
  env = {**env, **({"PYTHONPATH": ":".join(paths)} if paths else {})}
  args += seal_args(_host_binds(args))
  args += [*mounts, "--proc", "/proc", "--dev", "/dev"]
  for mount_point, size_mb in tmpfs:
    args += ["--size", str(size_mb << 20), "--tmpfs", mount_point]
  args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", chdir, "--clearenv"]
  for key, value in env.items():
    args += ["--setenv", key, value]
  return args + ["--", *command]


def sealed_dirs(site: str | None = None) -> list[str]:
  """Host folders no sandbox may read: this envservers package (its data holds the SWE tasks'
  hidden tests and bugs, whose inverse is the fix) wherever it is installed, and any other
  `envservers` package in the mounted site-packages."""
  found = [os.path.realpath(_HERE.parent)]
  if site and os.path.isdir(os.path.join(site, "envservers")):
    found.append(os.path.realpath(os.path.join(site, "envservers")))
  return list(dict.fromkeys(found))


def _host_binds(args: list[str]) -> list[tuple[str, str]]:
  """The (host source, sandbox destination) of each --ro-bind in `args`."""
  return [(args[i + 1], args[i + 2]) for i, arg in enumerate(args) if arg == "--ro-bind"]


def seal_args(binds: list[tuple[str, str]]) -> list[str]:
  """Mount options laying an empty read-only tmpfs over every sealed folder that a bind exposes
  (a non-editable install puts the package under the venv's site-packages, a system install under
  /usr): the sandbox sees an empty folder there."""
  site = next((src for src, dest in binds if dest == SITE_PACKAGES), None)
  out = []
  for sealed in sealed_dirs(site):
    for src, dest in binds:
      real = os.path.realpath(src)
      if sealed == real or sealed.startswith(real.rstrip("/") + "/"):
        inside = os.path.join(dest, os.path.relpath(sealed, real))
        out += ["--size", "4096", "--tmpfs", inside, "--remount-ro", inside]
  return out


class BwrapProcess:
  """The host side of one sandbox process: `spawn`, `confine_memory`, `stop`. A class using it
  keeps `process`, `stderr` and `cgroup` (None until set here)."""

  process: trio.Process | None = None
  stderr: StderrCapture | None = None
  cgroup: str | None = None

  async def spawn(self, args: list[str], what: str) -> trio.Process:
    """Starts `args` (a bwrap command line, maybe behind a launcher) with pipes on stdin and
    stdout; EnvCrashed naming `what` when bubblewrap is missing."""
    if not os.path.exists(BWRAP):
      raise EnvCrashed(
        f"bubblewrap ({BWRAP}) is not installed: {what} needs it (Debian package 'bubblewrap'; .ci/setup installs it)"
      )
    # bwrap's own process (pid 1 inside, its /proc/1/environ readable there) gets no host env.
    options: dict[str, Any] = {"start_new_session": True, "env": {"PATH": "/usr/bin:/bin"}}
    if os.geteuid() == 0:  # a uid of its own: NPROC holds per sandbox, root's files unreadable
      uid = 1_000_000 + (os.getpid() % 2000) * 4096 + next(_uid_counter) % 4096
      options.update(user=uid, group=uid, extra_groups=[])
    self.stderr = StderrCapture()
    self.process = await trio.lowlevel.open_process(
      args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr.file, **options
    )
    return self.process

  def confine_memory(self, limit_bytes: int) -> None:
    """Moves the whole process tree into a new memory cgroup of `limit_bytes` (where the server
    may make one; call it before any user code runs); EnvCrashed if that fails (`stop` still
    removes the group)."""
    try:
      self.cgroup = memory_cgroup.create(limit_bytes)
    except OSError as e:
      raise EnvCrashed(f"could not create the sandbox's memory cgroup: {e}") from e
    if self.cgroup:
      outside = memory_cgroup.add_process_tree(self.cgroup, self.process.pid)
      if outside or self.process.pid not in memory_cgroup.members(self.cgroup):
        raise EnvCrashed(f"could not move the sandbox into its memory cgroup (pids left outside: {outside})")

  async def stop(self) -> None:
    """Kills the process and everything inside; removes its memory cgroup."""
    process, self.process = self.process, None
    await kill_process(process)
    if self.stderr is not None:
      self.stderr.close()
      self.stderr = None
    cgroup, self.cgroup = self.cgroup, None
    with trio.CancelScope(shield=True):
      await memory_cgroup.remove_soon(cgroup)
