"""An outside harness as an agent: a command that owns its loop and its HTTP client, one process per chain.

  agent_fn = command_agent(["python", "my_harness.py"])     # or Task(agent_cmd=...) / config.task.agent_cmd
  trajectories = run_endpoint_rollout(agent, rows, agent_fn, sampler=sampler)

Each chain starts the command with its own endpoint address and key in the environment,
`OPENAI_BASE_URL` (".../v1") and `OPENAI_API_KEY` (the variables the `openai` SDK and most
harnesses read), the row as JSON in `AGENTFLY_ROW` and on stdin; the chain's answer is what the
process writes to stdout (stripped). The command may use any language, loop or HTTP client: the
endpoint records the tokens of its requests exactly as for an in-process agent. A process that
exits non-zero fails its chain with an error naming the command, its exit status and the tail of
its stderr (a run whose chains all fail stops: rl/chain_failures.py); the chain's timeout
(`chain_timeout_s`) kills it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from typing import Sequence

import trio


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


def command_agent(cmd: str | Sequence[str], *, where: str = "agent_cmd", stderr_tail: int = 2000):
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
    done = await trio.run_process(
      words, stdin=row_json.encode(), capture_stdout=True, capture_stderr=True, env=env, check=False
    )
    if done.returncode != 0:
      tail = done.stderr.decode(errors="replace")[-stderr_tail:].strip()
      raise HarnessError(f"{where}: {shlex.join(words)!r} exited with status {done.returncode}; stderr: {tail}")
    return done.stdout.decode(errors="replace").strip()

  run.agent_loop = "trio"
  run.__qualname__ = run.__name__ = f"command_agent({shlex.join(words)!r})"
  run.command = words
  return run


__all__ = ["HarnessError", "command_agent", "command_words"]
