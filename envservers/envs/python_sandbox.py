"""`python_sandbox`: a persistent Python interpreter per chain, under bubblewrap.

Each instance is one `bwrap` process running `sandbox_driver.py` with:
- no network and private IPC/PID/UTS/cgroup namespaces (`--unshare-all`), `--die-with-parent`,
  `--new-session` (no terminal injection);
- a read-only /usr (the system Python and its libraries), nothing else of the host: no /root,
  no /home, no repo, no /etc beyond the loader cache and the time zone;
- a private writable work dir /workspace, /tmp and /dev/shm, all size-capped tmpfs that vanish
  with it (nothing else is writable);
- rlimits set by the driver: address space, processes, file size, CPU time per call;
- when the server runs as root, a uid of its own (so RLIMIT_NPROC holds per instance and the
  host's root-only files stay unreadable even through /proc);
- a time limit per call: the running code gets a TimeoutError and the interpreter keeps its
  state; code that ignores it is killed after a grace period and the chain continues on a fresh
  interpreter (told so in its next observation).
Actions are code strings, or {"code": str, "timeout_s": float} to lower the limit for one call.
The observation is what the code printed (stdout, then a trailing expression's repr as in a
notebook, then stderr with any traceback), each truncated; info has byte counts and `error`
(the exception type name, or None).
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import sysconfig
from typing import Any

import trio

from envservers import protocol
from envservers.envs import memory_cgroup
from envservers.env import EnvCrashed, ServerEnv, StepOutcome, env_reward
from envservers.process import StderrCapture, exit_reason, kill_process, wait_exit
from envservers.registry import register_env

BWRAP = "/usr/bin/bwrap"
_DRIVER_SOURCE = (__import__("pathlib").Path(__file__).with_name("sandbox_driver.py")).read_text()
_uid_counter = itertools.count()


@functools.lru_cache(maxsize=None)
def _python_version(python: str) -> str:
  return subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                        capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def _default_python() -> str:
  if os.path.exists("/usr/bin/python3"):
    return "/usr/bin/python3"
  return os.path.realpath(sys.executable)


def _host_site_packages(python: str) -> str | None:
  """The server venv's site-packages, if the sandbox Python can use it (same major.minor)."""
  if sys.prefix == sys.base_prefix:
    return None
  purelib = sysconfig.get_paths()["purelib"]
  try:
    same = _python_version(python) == "%d.%d" % sys.version_info[:2]
  except (OSError, subprocess.SubprocessError):
    return None
  return purelib if same and os.path.isdir(purelib) else None


@register_env
class PythonSandbox(ServerEnv):
  """Options (server flag `--env-opt python_sandbox.NAME=VALUE`):
    timeout_s: time limit per call (default 30): past it the running code gets a TimeoutError
      and the interpreter keeps its state; if the code does not stop within `kill_grace_s`
      (default 2) more, the host kills the sandbox and the chain continues on a fresh one.
    cpu_s: CPU seconds per call (default 30); cpu_total_s per instance (default 600).
    memory_mb: address-space limit (default 1024). max_procs: processes (default 64).
    max_open_files: descriptors (default 256).
    memory_cgroup: also put it in a memory cgroup of memory_mb + work_mb + 2 * tmp_mb (counts
      tmpfs and memfd memory too) where the server may create one (default true; see
      memory_cgroup.py).
    file_size_mb: largest file (default 64). work_mb / tmp_mb: tmpfs sizes (default 256 / 64).
    max_output_bytes: stdout and stderr are each cut to this (default 16384).
    python: interpreter inside the sandbox (default /usr/bin/python3).
    site_packages: also expose the server venv's packages read-only (default true).
  """
  name = "python_sandbox"
  reusable = False   # a released interpreter holds a chain's state: never hand it to another

  def __init__(self, timeout_s: float = 30.0, cpu_s: float = 30.0, cpu_total_s: float = 600.0,
               memory_mb: int = 1024, max_procs: int = 64, file_size_mb: int = 64,
               work_mb: int = 256, tmp_mb: int = 64, max_output_bytes: int = 16384,
               python: str | None = None, site_packages: bool = True,
               kill_grace_s: float = 2.0, max_open_files: int = 256, memory_cgroup: bool = True):
    numbers = dict(timeout_s=timeout_s, cpu_s=cpu_s, cpu_total_s=cpu_total_s, memory_mb=memory_mb,
                   max_procs=max_procs, file_size_mb=file_size_mb, work_mb=work_mb, tmp_mb=tmp_mb,
                   max_output_bytes=max_output_bytes, kill_grace_s=kill_grace_s,
                   max_open_files=max_open_files)
    for key, value in numbers.items():
      if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"python_sandbox option {key!r} must be a positive number, got {value!r}")
    self.call_timeout_s = float(timeout_s) + float(kill_grace_s)   # the host's hard limit
    self.limits = {"timeout_s": float(timeout_s), "cpu_s": float(cpu_s),
                   "cpu_total_s": int(cpu_total_s),
                   "memory_mb": int(memory_mb), "max_procs": int(max_procs),
                   "max_open_files": int(max_open_files),
                   "file_size_mb": int(file_size_mb), "max_output_bytes": int(max_output_bytes)}
    self.work_mb, self.tmp_mb = int(work_mb), int(tmp_mb)
    self.python = python or _default_python()
    self.site_packages = bool(site_packages)
    self.process: trio.Process | None = None
    self.reader: protocol.FrameReader | None = None
    self.calls = 0
    self.stderr: StderrCapture | None = None
    self.memory_cgroup = bool(memory_cgroup)
    self.cgroup: str | None = None

  @property
  def worker_pid(self) -> int | None:
    return self.process.pid if self.process is not None else None

  def alive(self) -> bool:
    return self.process is not None and self.process.poll() is None

  def command(self) -> list[str]:
    """The bwrap command line for one instance."""
    args = [BWRAP, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/lib", "/lib64", "/sbin"):
      if os.path.islink(top):
        args += ["--symlink", os.readlink(top), top]
      elif os.path.isdir(top):
        args += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/localtime"):
      if os.path.exists(path):
        args += ["--ro-bind", path, path]
    python_real = os.path.realpath(self.python)
    if not python_real.startswith("/usr/"):
      prefix = os.path.dirname(os.path.dirname(python_real))
      args += ["--ro-bind", prefix, prefix]
    env = {"HOME": "/workspace", "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    site = _host_site_packages(self.python) if self.site_packages else None
    if site:
      args += ["--ro-bind", site, "/opt/site-packages"]
      env["PYTHONPATH"] = "/opt/site-packages"
    # Every writable place is a size-capped tmpfs (bwrap's /dev is itself an uncapped tmpfs:
    # it is made read-only, device nodes keep working, /dev/shm gets a capped tmpfs).
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(self.tmp_mb << 20), "--tmpfs", "/dev/shm",
             "--size", str(self.tmp_mb << 20), "--tmpfs", "/tmp",
             "--size", str(self.work_mb << 20), "--tmpfs", "/workspace",
             "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/workspace", "--clearenv"]
    for key, value in env.items():
      args += ["--setenv", key, value]
    args += ["--", self.python, "-u", "-c", _DRIVER_SOURCE, json.dumps(self.limits)]
    return args

  async def start(self) -> None:
    if not os.path.exists(BWRAP):
      raise EnvCrashed(f"bubblewrap ({BWRAP}) is not installed: the Python sandbox needs it "
                       f"(Debian package 'bubblewrap'; .ci/setup installs it)")
    # bwrap's own process (pid 1 inside, its /proc/1/environ readable there) gets no host env.
    options: dict[str, Any] = {"start_new_session": True, "env": {"PATH": "/usr/bin:/bin"}}
    if os.geteuid() == 0:  # run as a uid of our own: NPROC holds, root-only files unreadable
      uid = 1_000_000 + (os.getpid() % 2000) * 4096 + next(_uid_counter) % 4096
      options.update(user=uid, group=uid, extra_groups=[])
    self.stderr = StderrCapture()
    self.process = await trio.lowlevel.open_process(
        self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr.file,
        **options)
    self.reader = protocol.FrameReader(self.process.stdout)
    hello = await self._receive()
    if self.memory_cgroup:   # before any user code runs
      limit = (self.limits["memory_mb"] + self.work_mb + 2 * self.tmp_mb) << 20
      try:
        self.cgroup = memory_cgroup.create(limit)
      except OSError as e:
        raise EnvCrashed(f"could not create the sandbox's memory cgroup: {e}") from e
      if self.cgroup:
        outside = memory_cgroup.add_process_tree(self.cgroup, self.process.pid)
        if outside or self.process.pid not in memory_cgroup.members(self.cgroup):
          raise EnvCrashed(f"could not move the sandbox into its memory cgroup (pids left outside: {outside})")
    if not hello.get("ready"):
      raise EnvCrashed(f"sandbox driver sent {hello!r} instead of ready")

  async def _crashed(self, what: str) -> EnvCrashed:
    returncode = await wait_exit(self.process) if self.process is not None else None
    detail = self.stderr.head() if self.stderr is not None else ""
    message = f"the Python sandbox died during {what}: {exit_reason(returncode)}"
    if returncode == -signal.SIGXCPU or returncode == 128 + signal.SIGXCPU:
      message += f" (CPU limit of {self.limits['cpu_s']:g} s per call)"
    return EnvCrashed(message + (f"; sandbox stderr: {detail}" if detail else ""))

  async def _receive(self) -> dict:
    try:
      body = await self.reader.read_body()
    except (protocol.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
      body = None
    if body is None:
      raise await self._crashed("a call")
    try:
      return protocol.decode_body(body)
    except protocol.ProtocolError as e:
      raise EnvCrashed(f"the Python sandbox sent a malformed reply: {e}") from None

  async def _request(self, message: dict) -> dict:
    if self.process is None:
      raise EnvCrashed("the Python sandbox is not running")
    try:
      await self.process.stdin.send_all(protocol.encode_frame(message))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
      raise await self._crashed("a call") from None
    return await self._receive()

  async def reset(self, row: dict | None) -> str:
    if self.calls:  # a new episode on a used interpreter: start from a clean one
      await self.close()
      self.calls = 0
      await self.start()
    return ""

  async def run_code(self, code: str, timeout_s: float | None = None) -> dict:
    """Runs `code` in the chain's interpreter; `timeout_s` may lower the soft time limit."""
    if not isinstance(code, str):
      raise TypeError(f"python_sandbox code must be a string, got {type(code).__name__}")
    limit = self.limits["timeout_s"]
    if timeout_s is not None:
      if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise ValueError(f"python_sandbox 'timeout_s' must be a positive number, got {timeout_s!r}")
      limit = min(limit, float(timeout_s))
    self.calls += 1
    return await self._request({"op": "exec", "code": code, "timeout_s": limit})

  async def step(self, action: Any) -> StepOutcome:
    code = action.get("code") if isinstance(action, dict) else action
    timeout_s = action.get("timeout_s") if isinstance(action, dict) else None
    if not isinstance(code, str):
      return StepOutcome(
          observation=f"Error: the action must be Python code (a string or {{'code': str, "
                      f"'timeout_s': float}}), got {type(code).__name__}",
          info={"error": "BadAction"})
    try:
      reply = await self.run_code(code, timeout_s)
    except ValueError as e:
      return StepOutcome(observation=f"Error: {e}", info={"error": "BadAction"})
    observation = reply["stdout"]
    if reply["value"] is not None:
      observation += reply["value"] + "\n"
    observation += reply["stderr"]
    return StepOutcome(observation=observation, info={
        "stdout_bytes": reply["stdout_bytes"], "stderr_bytes": reply["stderr_bytes"],
        "error": reply["error"]})

  @env_reward("code_passes")
  async def code_passes(self, code: str) -> dict:
    """1.0 if `code` (e.g. asserts/tests) runs without an exception in the chain's interpreter."""
    reply = await self.run_code(code)
    return {"reward": 0.0 if reply["error"] else 1.0, "error": reply["error"]}

  async def close(self) -> None:
    process, self.process = self.process, None
    await kill_process(process)
    if self.stderr is not None:
      self.stderr.close()
      self.stderr = None
    cgroup, self.cgroup = self.cgroup, None
    with trio.CancelScope(shield=True):
      await memory_cgroup.remove_soon(cgroup)
    self.memory_cgroup = bool(memory_cgroup)
    self.cgroup: str | None = None


