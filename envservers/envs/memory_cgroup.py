"""Best-effort memory cgroups for sandboxes (cgroup v1 memory controller, if writable).

RLIMIT_AS bounds a process's mappings but not memory held in tmpfs files or memfds; a memory
cgroup bounds all of it. Where the server may create a child of its own memory cgroup (root,
cgroup v1 with a writable memory hierarchy, as on this project's CPU machines), each sandbox gets
one with `memory.limit_in_bytes`; past it the kernel OOM-kills inside the sandbox only. Elsewhere
this is a no-op and the rlimits + capped tmpfs remain the bounds.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal

_counter = itertools.count()


@functools.lru_cache(maxsize=None)
def _parent_dir() -> str | None:
  """This process's memory cgroup directory, if we may create children in it."""
  try:
    with open("/proc/self/cgroup") as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  for line in lines:
    _, controllers, path = line.split(":", 2)
    if "memory" in controllers.split(","):
      directory = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
      probe = os.path.join(directory, f"agentfly-probe-{os.getpid()}")
      try:
        os.mkdir(probe)
        os.rmdir(probe)
      except OSError:
        return None
      _sweep_stale(directory)
      return directory
  return None


def _sweep_stale(directory: str) -> None:
  """Removes sandbox cgroups left by servers that died without cleaning up: those whose owner
  is gone, and those named with our own pid (we have made none yet, so they belong to a dead
  process whose pid was reused: pids wrap at pid_max, 32768 here, within hours)."""
  for name in os.listdir(directory):
    if name.startswith("agentfly-sandbox-"):
      owner = name.split("-")[2]
      if owner.isdigit() and (int(owner) == os.getpid() or not os.path.exists(f"/proc/{owner}")):
        remove(os.path.join(directory, name))


def available() -> bool:
  return _parent_dir() is not None


def create(limit_bytes: int) -> str | None:
  """A new memory cgroup limited to `limit_bytes`; None where cgroups are not available.

  Raises OSError where they are available but this one could not be made (a sandbox must then
  not start unbounded). A leftover group of the same name (a dead process with our reused pid)
  is removed first.
  """
  parent = _parent_dir()
  if parent is None:
    return None
  path = os.path.join(parent, f"agentfly-sandbox-{os.getpid()}-{next(_counter)}")
  if os.path.isdir(path):
    remove(path)
  try:
    os.mkdir(path)
    with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
      f.write(str(int(limit_bytes)))
  except OSError:
    remove(path)
    raise
  return path


def process_tree(root_pid: int) -> list[int]:
  """`root_pid` and all its live descendants (parent pids read from /proc/*/stat), parents first."""
  children: dict[int, list[int]] = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
      continue  # exited meanwhile
    children.setdefault(parent, []).append(int(entry))
  if not os.path.exists(f"/proc/{root_pid}"):
    return []
  tree, i = [root_pid], 0
  while i < len(tree):
    tree.extend(children.get(tree[i], ()))
    i += 1
  return tree


def members(path: str) -> set[int]:
  """The pids in the cgroup."""
  with open(os.path.join(path, "cgroup.procs")) as f:
    return {int(pid) for pid in f.read().split()}


def add_process_tree(path: str, root_pid: int, passes: int = 3) -> list[int]:
  """Moves `root_pid` and all its descendants into the cgroup, then checks the group's own
  member list against the process tree again (a process forked during a pass is moved by the
  next). Returns the tree's pids still outside the group: empty means the whole tree is bounded.
  """
  outside: list[int] = []
  for _ in range(passes):
    inside = members(path)
    outside = [pid for pid in process_tree(root_pid) if pid not in inside]
    if not outside:
      break
    for pid in outside:
      try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
          f.write(str(pid))
      except OSError:
        pass  # exited meanwhile: the next pass no longer lists it
  else:
    inside = members(path)
    outside = [pid for pid in process_tree(root_pid) if pid not in inside]
  return outside


def remove(path: str | None) -> bool:
  """Kills what is left in the cgroup and deletes it; False if it is still busy."""
  if not path or not os.path.isdir(path):
    return True
  try:
    with open(os.path.join(path, "cgroup.procs")) as f:
      for pid in f.read().split():
        try:
          os.kill(int(pid), signal.SIGKILL)
        except OSError:
          pass
    os.rmdir(path)
  except OSError:
    return False
  return True


async def remove_soon(path: str | None, timeout_s: float = 5.0) -> None:
  """`remove`, retried while the killed processes are still exiting."""
  import trio

  with trio.move_on_after(timeout_s):
    while not remove(path):
      await trio.sleep(0.02)
