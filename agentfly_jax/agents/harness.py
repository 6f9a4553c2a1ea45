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

By default (`sandbox="bwrap"`; `task.agent_sandbox`) the command runs in a bubblewrap sandbox of its own
(agents/harness_sandbox.py): private /proc and network (its one way out is its endpoint, from an address the
chain's key is bound to), read-only mounts of only its program, its path arguments and `task.agent_mounts`,
an environment holding only OPENAI_BASE_URL, OPENAI_API_KEY, AGENTFLY_ROW, PATH, HOME and the variables named
in `task.agent_env`. Its row is the agent-visible one (data/row_fields.py). `sandbox="off"` runs it on the
host with the trainer's environment. What the sandbox costs a chain: lab/results/harness_sandbox.md.
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

from agentfly_jax.agents.harness_sandbox import (
  chain_bridge,
  check_sandbox,
  harness_mounts,
  sandbox_command,
  source_host,
)

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
# rlimits of a harness and everything it starts (harness_reaper --limits): address space (generous: node
# and JIT runtimes reserve large virtual ranges), the largest file it may write, open files
HARNESS_LIMITS = (16384, 1024, 4096)  # MiB, MiB, count


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
  words: Sequence[str],
  *,
  env: dict,
  stdin: bytes,
  max_stdout: int = MAX_ANSWER_BYTES,
  max_stderr: int = STDERR_KEPT,
  limits: tuple[int, int, int] = HARNESS_LIMITS,
) -> tuple[int, bytes, bytes]:
  """Runs `words` under the supervisor (module docstring) with `stdin` as its input and `limits` (memory MiB,
  file size MiB, open files; 0 = unchanged) on its whole tree; returns (exit status, the first `max_stdout`
  bytes of stdout, the last `max_stderr` of stderr) once the command has exited and everything it started
  is dead. Cancelled (the chain's timeout): the tree is killed, then Cancelled raises."""
  out, err = _Kept(max_stdout, tail=False), _Kept(max_stderr, tail=True)
  with tempfile.TemporaryFile() as stdin_file:  # a file, not a pipe: a harness that never reads it blocks nothing
    stdin_file.write(stdin)
    stdin_file.flush()
    stdin_file.seek(0)
    process = await trio.lowlevel.open_process(
      [sys.executable, "-I", "-S", REAPER, "--limits", ",".join(str(int(x)) for x in limits), "--", *words],
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


SANDBOXES = ("bwrap", "off")


def command_agent(
  cmd: str | Sequence[str],
  *,
  where: str = "agent_cmd",
  stderr_tail: int = 2000,
  max_answer_bytes: int = MAX_ANSWER_BYTES,
  sandbox: str = "bwrap",
  env_names: Sequence[str] = (),
  mounts: Sequence[str] = (),
):
  """`async def run(client, row)` that runs `cmd` for the chain (see the module docstring).

  Args:
    sandbox: "bwrap": each chain's process in a bubblewrap sandbox of its own (agents/harness_sandbox.py) whose
      environment holds only OPENAI_BASE_URL, OPENAI_API_KEY, AGENTFLY_ROW, PATH, HOME and `env_names`; "off":
      on the host, with the trainer's whole environment.
    env_names: variables of the trainer's environment the sandboxed harness also gets (those that are set).
    mounts: host folders the sandbox shows read-only beside the harness's program and path arguments.
  """
  words = command_words(cmd, where)
  if sandbox not in SANDBOXES:
    raise ValueError(f"{where}: agent_sandbox={sandbox!r}: must be one of {list(SANDBOXES)}")
  for name in env_names:
    if not isinstance(name, str) or not name or "=" in name:
      raise ValueError(f"{where}: agent_env: {name!r} is not a variable name")
  if sandbox == "bwrap":
    check_sandbox(where)
    try:
      visible = harness_mounts(words, mounts)
    except ValueError as e:
      raise ValueError(f"{where}: {e}") from None

  async def run(client, row: dict, bind=None) -> str:
    """`bind(host)`, when given, binds the chain's key to its sandbox's address (the endpoint rollout's)."""
    row_json = json.dumps(row, ensure_ascii=False, default=str)
    given = {
      "OPENAI_BASE_URL": str(client.base_url).rstrip("/"),
      "OPENAI_API_KEY": client.api_key,
      "AGENTFLY_ROW": row_json,
    }
    if sandbox == "off":
      result = await run_harness(
        words, env={**os.environ, **given}, stdin=row_json.encode(), max_stdout=max_answer_bytes
      )
    else:
      env = {**{n: os.environ[n] for n in env_names if n in os.environ}, **given}
      host, port = source_host(), client.base_url.port
      if bind is not None:
        bind(host)
      async with chain_bridge(port, host) as socket_dir:
        args = sandbox_command(words, env=env, socket_dir=socket_dir, port=port, mounts=visible)
        result = await run_harness(
          args, env={"PATH": "/usr/bin:/bin"}, stdin=row_json.encode(), max_stdout=max_answer_bytes
        )
    code, stdout, stderr = result
    if code != 0:
      tail = stderr.decode(errors="replace")[-stderr_tail:].strip()
      raise HarnessError(f"{where}: {shlex.join(words)!r} exited with status {code}; stderr: {tail}")
    return stdout.decode(errors="replace").strip()

  run.agent_loop = "trio"
  run.__qualname__ = run.__name__ = f"command_agent({shlex.join(words)!r})"
  run.command = words
  run.sandbox = sandbox
  return run


__all__ = ["HarnessError", "command_agent", "command_words", "run_harness"]
