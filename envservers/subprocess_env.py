"""Host side of `run_in_subprocess` envs: a proxy that drives one worker process per instance.

The worker (`python -m envservers.worker`) runs the real `BlockingEnv` instance; this proxy sends
it framed requests over pipes. If the worker dies (crash, OOM kill, `kill -9`) the call raises
EnvCrashed and the pool replaces the instance; if it hangs, the pool's wall-clock limit cancels
the call and `close()` kills it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

import trio

from envservers import protocol
from envservers.env import EnvCrashed, ServerEnv, StepOutcome, reward_dict
from envservers.process import StderrCapture, exit_reason, kill_process, wait_exit

log = logging.getLogger("envservers")


class WorkerError(RuntimeError):
  """The env code in the worker raised (the instance stays usable)."""


class SubprocessEnv(ServerEnv):
  """Runs `env_class(**options)` in its own process (see envservers.worker)."""

  def __init__(self, env_class: type, options: dict[str, Any]):
    self.env_class = env_class
    self.options = options
    self.name = env_class.name
    self.reusable = env_class.reusable
    self.call_timeout_s = env_class.call_timeout_s
    self.process: trio.Process | None = None
    self.reader: protocol.FrameReader | None = None
    self.stderr: StderrCapture | None = None

  @property
  def worker_pid(self) -> int | None:
    return self.process.pid if self.process is not None else None

  def alive(self) -> bool:
    return self.process is not None and self.process.poll() is None

  def reward_names(self) -> list[str]:
    return self.env_class.reward_names()

  async def start(self) -> None:
    target = f"{self.env_class.__module__}:{self.env_class.__qualname__}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    self.stderr = StderrCapture()
    self.process = await trio.lowlevel.open_process(
      [sys.executable, "-m", "envservers.worker", target, json.dumps(self.options)],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self.stderr.file,
      env=env,
      start_new_session=True,
    )
    self.reader = protocol.FrameReader(self.process.stdout)
    hello = await self._receive("start")
    if not hello.get("ready"):
      raise EnvCrashed(f"env {self.name!r} worker sent {hello!r} instead of ready")

  async def _receive(self, what: str) -> dict:
    body = await self.reader.read_reply()
    if body is None:
      returncode = await wait_exit(self.process)
      log.warning(
        "env %r worker %s died during %s (%s); its stderr ends:\n%s",
        self.name,
        self.process.pid,
        what,
        exit_reason(returncode),
        self.stderr.tail() if self.stderr else "",
      )
      raise EnvCrashed(f"env {self.name!r} worker process died during {what}: {exit_reason(returncode)}")
    return protocol.decode_body(body)

  async def _call(self, op: str, **fields) -> dict:
    if self.process is None:
      raise EnvCrashed(f"env {self.name!r} worker is not running")
    try:
      await self.process.stdin.send_all(protocol.encode_frame({"op": op, **fields}))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
      pass  # the read below reports how it died
    reply = await self._receive(op)
    if not reply.get("ok"):
      error = reply.get("error") or {}
      if error.get("type") == "EnvCrashed":  # the env declared itself unusable; the worker exits
        await kill_process(self.process)
        raise EnvCrashed(f"env {self.name!r}: {error.get('message')}")
      raise WorkerError(f"{error.get('type')}: {error.get('message')}")
    return reply["result"]

  async def reset(self, row):
    return (await self._call("reset", row=row))["observation"]

  async def step(self, action):
    result = await self._call("step", action=action)
    return StepOutcome(
      observation=result["observation"],
      reward=result.get("reward"),
      done=bool(result.get("done")),
      info=result.get("info") or {},
    )

  async def compute_reward(self, name: str, **kwargs):
    result = await self._call("compute_reward", name=name, kwargs=kwargs)
    return reward_dict(name, result["value"])

  async def close(self) -> None:
    if self.alive():  # let the env clean up (e.g. stop a simulator), briefly
      with trio.CancelScope(shield=True), trio.move_on_after(2):
        try:
          await self._call("close")
        except (EnvCrashed, WorkerError, protocol.ProtocolError):
          pass
    process, self.process = self.process, None
    await kill_process(process)
    if self.stderr is not None:
      self.stderr.close()
      self.stderr = None
