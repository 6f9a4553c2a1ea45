"""Child-process helpers shared by the envs that run a process per instance (the Python sandbox,
`run_in_subprocess` envs): a readable exit reason, a stderr capture with a tail, a hard stop."""

from __future__ import annotations

import os
import signal
import tempfile

import trio


def exit_reason(returncode: int | None) -> str:
  """Words for a child's exit status (negative = killed by a signal)."""
  if returncode is None:
    return "it stopped answering"
  if returncode < 0:
    return f"it was killed by {signal.Signals(-returncode).name}"
  if returncode > 128 and returncode - 128 in signal.valid_signals():
    return f"it was killed by {signal.Signals(returncode - 128).name}"
  return f"it exited with status {returncode}"


class StderrCapture:
  """A temporary file a child writes its stderr to; `head()` / `tail()` read it back."""

  def __init__(self):
    self.file = tempfile.TemporaryFile()

  def head(self, n: int = 2000) -> str:
    if self.file is None:
      return ""
    self.file.seek(0)
    return self.file.read(n).decode("utf-8", "replace").strip()

  def tail(self, n: int = 1500) -> str:
    if self.file is None:
      return ""
    self.file.seek(0, os.SEEK_END)
    self.file.seek(max(0, self.file.tell() - n))
    return self.file.read().decode("utf-8", "replace").strip()

  def close(self) -> None:
    if self.file is not None:
      self.file.close()
      self.file = None


async def wait_exit(process: trio.Process, timeout_s: float = 2.0) -> int | None:
  """The process's exit status once it has exited, or None if it is still running after
  `timeout_s`."""
  with trio.move_on_after(timeout_s):
    return await process.wait()
  return None


async def kill_process(process: trio.Process | None, timeout_s: float = 5.0) -> None:
  """SIGKILLs `process` (if still running), reaps it and closes its pipes; shielded, never
  raises."""
  if process is None:
    return
  with trio.CancelScope(shield=True):
    with trio.move_on_after(timeout_s):
      if process.poll() is None:
        try:
          process.kill()
        except ProcessLookupError:
          pass
      await process.wait()
    for stream in (process.stdin, process.stdout):
      if stream is not None:
        await trio.aclose_forcefully(stream)
