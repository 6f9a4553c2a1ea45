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

import json
import signal
from typing import Any

import trio

from envservers import protocol
from envservers.env import EnvCrashed, ServerEnv, StepOutcome, env_reward
from envservers.envs.bwrap import BwrapProcess, bwrap_args, default_python, driver_source
from envservers.process import exit_reason, wait_exit
from envservers.registry import register_env

_DRIVER_SOURCE = driver_source("sandbox_driver.py")


@register_env
class PythonSandbox(BwrapProcess, ServerEnv):
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
  reusable = False  # a released interpreter holds a chain's state: never hand it to another

  def __init__(
    self,
    timeout_s: float = 30.0,
    cpu_s: float = 30.0,
    cpu_total_s: float = 600.0,
    memory_mb: int = 1024,
    max_procs: int = 64,
    file_size_mb: int = 64,
    work_mb: int = 256,
    tmp_mb: int = 64,
    max_output_bytes: int = 16384,
    python: str | None = None,
    site_packages: bool = True,
    kill_grace_s: float = 2.0,
    max_open_files: int = 256,
    memory_cgroup: bool = True,
  ):
    numbers = dict(
      timeout_s=timeout_s,
      cpu_s=cpu_s,
      cpu_total_s=cpu_total_s,
      memory_mb=memory_mb,
      max_procs=max_procs,
      file_size_mb=file_size_mb,
      work_mb=work_mb,
      tmp_mb=tmp_mb,
      max_output_bytes=max_output_bytes,
      kill_grace_s=kill_grace_s,
      max_open_files=max_open_files,
    )
    for key, value in numbers.items():
      if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"python_sandbox option {key!r} must be a positive number, got {value!r}")
    self.call_timeout_s = float(timeout_s) + float(kill_grace_s)  # the host's hard limit
    self.limits = {
      "timeout_s": float(timeout_s),
      "cpu_s": float(cpu_s),
      "cpu_total_s": int(cpu_total_s),
      "memory_mb": int(memory_mb),
      "max_procs": int(max_procs),
      "max_open_files": int(max_open_files),
      "file_size_mb": int(file_size_mb),
      "max_output_bytes": int(max_output_bytes),
    }
    self.work_mb, self.tmp_mb = int(work_mb), int(tmp_mb)
    self.python = python or default_python()
    self.site_packages = bool(site_packages)
    self.process = None
    self.reader: protocol.FrameReader | None = None
    self.calls = 0
    self.stderr = None
    self.memory_cgroup = bool(memory_cgroup)
    self.cgroup = None

  @property
  def worker_pid(self) -> int | None:
    return self.process.pid if self.process is not None else None

  def alive(self) -> bool:
    return self.process is not None and self.process.poll() is None

  def command(self) -> list[str]:
    """The bwrap command line for one instance: a private writable work dir /workspace, /tmp
    and /dev/shm (size-capped tmpfs) and the walls of envs/bwrap.py."""
    env = {
      "HOME": "/workspace",
      "PATH": "/usr/local/bin:/usr/bin:/bin",
      "LANG": "C.UTF-8",
      "PYTHONIOENCODING": "utf-8",
      "PYTHONDONTWRITEBYTECODE": "1",
      "OPENBLAS_NUM_THREADS": "1",
      "OMP_NUM_THREADS": "1",
      "MKL_NUM_THREADS": "1",
      "MPLBACKEND": "Agg",
    }
    return bwrap_args(
      self.python,
      [self.python, "-u", "-c", _DRIVER_SOURCE, json.dumps(self.limits)],
      env=env,
      site_packages=self.site_packages,
      chdir="/workspace",
      tmpfs=[("/dev/shm", self.tmp_mb), ("/tmp", self.tmp_mb), ("/workspace", self.work_mb)],
    )

  async def start(self) -> None:
    await self.spawn(self.command(), "the Python sandbox")
    self.reader = protocol.FrameReader(self.process.stdout)
    hello = await self._receive()
    if self.memory_cgroup:  # before any user code runs
      self.confine_memory((self.limits["memory_mb"] + self.work_mb + 2 * self.tmp_mb) << 20)
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
    body = await self.reader.read_reply()
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
        info={"error": "BadAction"},
      )
    try:
      reply = await self.run_code(code, timeout_s)
    except ValueError as e:
      return StepOutcome(observation=f"Error: {e}", info={"error": "BadAction"})
    observation = reply["stdout"]
    if reply["value"] is not None:
      observation += reply["value"] + "\n"
    observation += reply["stderr"]
    return StepOutcome(
      observation=observation,
      info={"stdout_bytes": reply["stdout_bytes"], "stderr_bytes": reply["stderr_bytes"], "error": reply["error"]},
    )

  @env_reward("code_passes")
  async def code_passes(self, code: str) -> dict:
    """1.0 if `code` (e.g. asserts/tests) runs without an exception in the chain's interpreter."""
    reply = await self.run_code(code)
    return {"reward": 0.0 if reply["error"] else 1.0, "error": reply["error"]}

  async def close(self) -> None:
    await self.stop()
