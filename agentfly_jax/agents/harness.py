"""An outside harness as an agent: a command that owns its loop and its HTTP client, one process per chain.

  agent_fn = command_agent(["python", "my_harness.py"])     # or Task(agent_cmd=...) / config.task.agent_cmd
  trajectories = run_endpoint_rollout(agent, rows, agent_fn, sampler=sampler)

Each chain starts the command with its own endpoint address and key in the environment,
`OPENAI_BASE_URL` (".../v1") and `OPENAI_API_KEY` (the variables the `openai` SDK and most
harnesses read), the row as JSON in `AGENTFLY_ROW` and on stdin; the chain's answer is what the
process writes to stdout (stripped; the first `max_answer_bytes`). The command may use any language,
loop or HTTP client: the endpoint records the tokens of its requests exactly as for an in-process agent.
A process that exits non-zero fails its chain with an error naming the command, its exit status and the
tail of its stderr (a run whose chains all fail stops: rl/chain_failures.py).

The command runs under a supervisor of its own (agents/harness_reaper.py, in a new session; the command
in a process group of its own), the child subreaper of everything the command starts: when the command
exits, every process it left behind (a daemon that double-forked and called setsid too) is killed before
the chain goes on, so its stdout ends with the command and nothing it started outlives the chain. At the
chain's timeout (`chain_timeout_s`: the rollout cancels the chain) the supervisor is sent SIGTERM and kills
the whole tree the same way (SIGKILL of its session after `STOP_GRACE_S` if it has not exited by then).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Sequence

import trio

log = logging.getLogger(__name__)


class HarnessError(RuntimeError):
  """The harness command failed (the message names it, its exit status and its stderr's tail)."""


def command_words(cmd: str | Sequence[str], where: str = "agent_cmd") -> list[str]:
  """The command as a word list (a string is split as a shell would); ValueError naming `where` when
  it is empty or its program is not found."""
  words = shlex.split(cmd) if isinstance(cmd, str) else [str(w) for w in cmd]
  if not words:
    raise ValueError(f"{where}: the command is empty")
  if shutil.which(words[0]) is None:
    raise ValueError(f"{where}={cmd!r}: program {words[0]!r} not found (not a file, not on PATH)")
  return words


STOP_GRACE_S = 5.0  # after SIGTERM, the supervisor's time to kill the harness's tree before its session is SIGKILLed
DRAIN_S = 1.0  # after the supervisor exits, the time its pipes get to deliver what is left (every writer is dead)
MAX_ANSWER_BYTES = 1 << 20  # stdout kept as the answer
STDERR_KEPT = 64 << 10  # the tail of stderr kept for the error message
REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness_reaper.py")


class _Kept:
  """The bytes of one output stream: its first `limit` bytes (`tail=False`) or its last."""

  def __init__(self, limit: int, tail: bool):
    self.limit, self.tail, self.data, self.seen = limit, tail, bytearray(), 0

  def add(self, chunk: bytes) -> None:
    self.seen += len(chunk)
    if self.tail:
      self.data += chunk
      del self.data[: max(0, len(self.data) - self.limit)]
    elif len(self.data) < self.limit:
      self.data += chunk[: self.limit - len(self.data)]


async def _drain(stream, kept: _Kept, done: trio.Event) -> None:
  try:
    while chunk := await stream.receive_some(65536):
      kept.add(chunk)
  except (trio.BrokenResourceError, trio.ClosedResourceError):
    pass
  finally:
    done.set()


async def _stop(process) -> None:
  """SIGTERM to the supervisor (it kills the harness's tree), then SIGKILL of its session if it is still
  there after STOP_GRACE_S; waits for it."""
  if process.returncode is not None:
    return
  with contextlib.suppress(ProcessLookupError):
    process.send_signal(signal.SIGTERM)
  with trio.move_on_after(STOP_GRACE_S):
    await process.wait()
  if process.returncode is None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
      os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


async def run_harness(
  words: Sequence[str], *, env: dict, stdin: bytes, max_stdout: int = MAX_ANSWER_BYTES, max_stderr: int = STDERR_KEPT
) -> tuple[int, bytes, bytes]:
  """Runs `words` under the supervisor (module docstring) with `stdin` as its input; returns (exit status,
  the first `max_stdout` bytes of stdout, the last `max_stderr` of stderr) once the command has exited and
  everything it started is dead. Cancelled (the chain's timeout): the tree is killed, then Cancelled raises."""
  out, err = _Kept(max_stdout, tail=False), _Kept(max_stderr, tail=True)
  with tempfile.TemporaryFile() as stdin_file:  # a file, not a pipe: a harness that never reads it blocks nothing
    stdin_file.write(stdin)
    stdin_file.flush()
    stdin_file.seek(0)
    process = await trio.lowlevel.open_process(
      [sys.executable, "-I", "-S", REAPER, "--", *words],
      stdin=stdin_file,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
      start_new_session=True,
    )
  try:
    async with trio.open_nursery() as nursery:
      drained = [trio.Event(), trio.Event()]
      nursery.start_soon(_drain, process.stdout, out, drained[0])
      nursery.start_soon(_drain, process.stderr, err, drained[1])
      await process.wait()
      with trio.move_on_after(DRAIN_S):
        for event in drained:
          await event.wait()
      nursery.cancel_scope.cancel()
  finally:
    with trio.CancelScope(shield=True):
      await _stop(process)
      for stream in (process.stdout, process.stderr):
        await stream.aclose()
  if out.seen > max_stdout:
    log.warning("harness %s wrote %d bytes to stdout; its answer is the first %d", words[0], out.seen, max_stdout)
  return process.returncode, bytes(out.data), bytes(err.data)


def command_agent(
  cmd: str | Sequence[str],
  *,
  where: str = "agent_cmd",
  stderr_tail: int = 2000,
  max_answer_bytes: int = MAX_ANSWER_BYTES,
):
  """`async def run(client, row)` that runs `cmd` for the chain (see the module docstring)."""
  words = command_words(cmd, where)

  async def run(client, row: dict) -> str:
    row_json = json.dumps(row, ensure_ascii=False, default=str)
    env = {
      **os.environ,
      "OPENAI_BASE_URL": str(client.base_url).rstrip("/"),
      "OPENAI_API_KEY": client.api_key,
      "AGENTFLY_ROW": row_json,
    }
    code, stdout, stderr = await run_harness(words, env=env, stdin=row_json.encode(), max_stdout=max_answer_bytes)
    if code != 0:
      tail = stderr.decode(errors="replace")[-stderr_tail:].strip()
      raise HarnessError(f"{where}: {shlex.join(words)!r} exited with status {code}; stderr: {tail}")
    return stdout.decode(errors="replace").strip()

  run.agent_loop = "trio"
  run.__qualname__ = run.__name__ = f"command_agent({shlex.join(words)!r})"
  run.command = words
  return run


__all__ = ["HarnessError", "command_agent", "command_words", "run_harness"]
