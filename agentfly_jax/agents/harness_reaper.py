"""The supervisor of one outside harness: runs the command, and when it exits (or on SIGTERM) kills every
process it left behind, then exits with the command's status.

  python -I -S harness_reaper.py [--limits MEMORY_MB,FILE_SIZE_MB,OPEN_FILES] -- COMMAND [ARGS...]

Run by agents/harness.py, one per chain, in a session of its own. It makes itself the child subreaper
(prctl PR_SET_CHILD_SUBREAPER), so every descendant of the command stays its descendant even after it
detaches (double fork + setsid: an orphan is re-parented to the nearest subreaper, not to init); the
command runs in a process group of its own. When the command exits, or when the supervisor gets SIGTERM
(the chain's timeout) or its parent dies (PR_SET_PDEATHSIG), it SIGKILLs the command's group and then,
until it has no child left, every child it has (orphans re-parented to it included), reaping them. So
when the supervisor has exited, nothing the harness started is alive, and nothing holds its stdout open.

`--limits`: rlimits the command and everything it starts inherit (address space, the size of a file it
writes: a larger write fails with EFBIG, open files; no core files); 0 leaves that one as it is.

Standard library only, no agentfly_jax import (it runs with -I -S: a bare interpreter starts fast).
Exit status: the command's, 128 + N when a signal N ended it, 125 when the supervisor could not start it
(the reason on stderr), 143 when it was stopped by SIGTERM.
"""

import ctypes
import os
import resource
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


class Stopped(Exception):
  """SIGTERM (the chain's timeout) or the parent's death: stop the harness now."""


def _stop(signum, frame):
  raise Stopped()


def children() -> list[int]:
  """The pids whose parent is this process (from /proc: every thread's children list, else the ppid of
  every process)."""
  me, out = os.getpid(), []
  try:
    for tid in os.listdir(f"/proc/{me}/task"):
      with open(f"/proc/{me}/task/{tid}/children") as f:
        out += [int(p) for p in f.read().split()]
    return out
  except OSError:
    out = []
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat") as f:
          stat = f.read()
      except OSError:
        continue
      if int(stat.rsplit(")", 1)[1].split()[1]) == me:
        out.append(int(name))
  return out


def kill_all(group: int) -> None:
  """SIGKILLs the command's process group, then every child until none is left (re-parented orphans
  included), reaping each."""
  try:
    os.killpg(group, signal.SIGKILL)
  except OSError:
    pass
  while True:
    for pid in children():
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    try:
      pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return  # no child at all: every descendant is gone
    if pid == 0:
      time.sleep(0.002)


def status_of(wait_status: int) -> int:
  if os.WIFSIGNALED(wait_status):
    return 128 + os.WTERMSIG(wait_status)
  return os.WEXITSTATUS(wait_status)


def set_limits(spec: str) -> None:
  """rlimits from "MEMORY_MB,FILE_SIZE_MB,OPEN_FILES" (0: that one unchanged), and no core files."""
  memory_mb, file_mb, open_files = (int(x) for x in spec.split(","))
  mb = 1024 * 1024
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write fails with EFBIG instead of killing
  for kind, value in ((resource.RLIMIT_AS, memory_mb * mb), (resource.RLIMIT_FSIZE, file_mb * mb)):
    if value:
      resource.setrlimit(kind, (value, value))
  if open_files:
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: list[str]) -> int:
  limits = None
  if len(argv) >= 2 and argv[0] == "--limits":
    limits, argv = argv[1], argv[2:]
  if len(argv) < 2 or argv[0] != "--":
    print("harness_reaper: usage: harness_reaper.py [--limits M,F,N] -- COMMAND [ARGS...]", file=sys.stderr)
    return 125
  command = argv[1:]
  parent = os.getppid()
  signal.signal(signal.SIGTERM, _stop)
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
    print(f"harness_reaper: prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}", file=sys.stderr)
    return 125
  libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
  if os.getppid() != parent:  # the parent died before the death signal was armed
    return 143
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # held until the wait below can handle it
  pid = os.fork()
  if pid == 0:
    try:
      signal.signal(signal.SIGTERM, signal.SIG_DFL)
      signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
      os.setpgid(0, 0)
      if limits:
        set_limits(limits)
      os.execvp(command[0], command)
    except BaseException as e:
      print(f"harness_reaper: cannot run {command[0]!r}: {e}", file=sys.stderr)
    finally:
      os._exit(125)
  try:
    os.setpgid(pid, pid)  # also from this side: the group exists before any kill below
  except OSError:
    pass
  code = 143
  try:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    while True:
      done, wait_status = os.waitpid(pid, 0)
      if done == pid:
        code = status_of(wait_status)
        break
  except Stopped:
    pass
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  kill_all(pid)
  return code


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
