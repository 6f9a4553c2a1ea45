"""The repository driver that runs INSIDE the `swe` env's bubblewrap sandbox (stdlib only;
driver_common.py inlined by the host).

Started as `python3 -S -c <this file's source> <config json>` with the episode's repository on a
size-capped tmpfs at /repo (the only writable tree besides a small /tmp). It reads requests
from fd 0 and writes replies to fd 1, both 4-byte big-endian length + JSON frames. Commands run
as `bash -c` children with the sandbox's rlimits (set here, at start, and inherited) and a CPU
limit per command; when a command ends (or runs past its time limit) every other process in the
sandbox's pid namespace is killed (`kill(-1)`), so nothing of one command outlives it. File
requests resolve paths inside this mount namespace, so no path can reach the host.

Requests -> replies:
  {"op": "load", "tar_b64": str, "dest": "/repo" | "/hidden_tests", "edit": {path, old, new}}
                                              -> {"files": int}  (extracts a .tar.gz there, then
                                                 makes the optional exact edit: a task's bug)
  {"op": "bash", "command": str, "timeout_s": float}
                                              -> {"output", "exit_code", "timed_out", "bytes"}
  {"op": "view", "path": str, "start": int, "end": int | None}  -> {"output"} or {"error"}
  {"op": "str_replace", "path": str, "old": str, "new": str}    -> {"output"} or {"error"}
  {"op": "snapshot", "max_bytes": int}        -> {"tar_b64": str} or {"error"}
  {"op": "grade", "command": str, "timeout_s": float, "junit": str}
                                              -> {"cases": [[name, outcome], ...], "output", ...}
  {"op": "ping"}                              -> {"pong": true}
"""

import base64
import io
import json
import os
import resource
import select
import signal
import subprocess
import tarfile
import time
import xml.etree.ElementTree as ElementTree

from envservers.envs.driver_common import receive, send, set_rlimits

REPO = "/repo"
_SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache"})


def _kill_others():
  """SIGKILLs every process of the sandbox but this one (and the namespace's init) until none
  is left; a fork bomb cannot outrun it (kill(-1) reaches every process in one pass)."""
  for _ in range(200):
    try:
      os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
      pass
    try:
      while os.waitpid(-1, os.WNOHANG)[0] > 0:
        pass
    except ChildProcessError:
      pass
    alive = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
    if not alive:
      return
    time.sleep(0.002)


def _joined(head, tail, total, cap):
  """The text of a command's output from its kept head and tail bytes, with a note where the
  middle was cut."""
  if len(head) + len(tail) >= total:
    return (bytes(head) + bytes(tail)).decode("utf-8", "replace")
  tail = bytes(tail[-(cap // 2) :])
  return (
    bytes(head).decode("utf-8", "replace")
    + f"\n... [output truncated: {total} bytes in all; the first {len(head)} and the last "
    f"{len(tail)} shown] ...\n" + tail.decode("utf-8", "replace")
  )


def _clip(text, cap):
  """`text` cut to about `cap` bytes (head and tail kept) with a note."""
  data = text.encode("utf-8")
  return _joined(data[: cap // 2], data[cap // 2 :][-(cap // 2) :], len(data), cap)


def _run(config, command, timeout_s, cwd=REPO):
  """Runs `bash -c command` (stdout and stderr together); returns (output text, its total
  bytes, exit code or None, timed_out). Past `max_output_bytes` the middle is cut."""
  cap = int(config["max_output_bytes"])
  cpu_s = int(config["cpu_s"])

  def limit_cpu():
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))

  read_fd, write_fd = os.pipe()
  try:
    child = subprocess.Popen(
      ["/bin/bash", "-c", command],
      stdin=subprocess.DEVNULL,
      stdout=write_fd,
      stderr=write_fd,
      cwd=cwd,
      preexec_fn=limit_cpu,
      start_new_session=True,
      close_fds=True,
    )
  except OSError as e:
    os.close(read_fd)
    os.close(write_fd)
    return f"could not start the command: {e}", 0, None, False
  os.close(write_fd)
  head, tail, total = bytearray(), bytearray(), 0
  deadline = time.monotonic() + timeout_s
  exited_at, timed_out = None, False
  while True:
    now = time.monotonic()
    if now >= deadline:
      timed_out = child.poll() is None
      break
    if exited_at is None and child.poll() is not None:
      exited_at = now
    if exited_at is not None and now - exited_at > 0.2:  # background holders of the pipe
      break
    ready, _, _ = select.select([read_fd], [], [], min(0.05, deadline - now))
    if not ready:
      continue
    chunk = os.read(read_fd, 1 << 16)
    if not chunk:
      break
    total += len(chunk)
    if len(head) < cap // 2:
      take = cap // 2 - len(head)
      head += chunk[:take]
      chunk = chunk[take:]
    tail += chunk
    if len(tail) > 2 * cap:  # keep the last cap // 2 bytes (trimmed in batches)
      del tail[: len(tail) - cap // 2]
  os.close(read_fd)
  code = None
  if not timed_out:  # the output ended: the command itself may still run until the deadline
    try:
      code = child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      timed_out = True
  _kill_others()  # (reaps the child too: its status was read above)
  return _joined(head, tail, total, cap), total, (None if timed_out else code), timed_out


def op_bash(config, request):
  text, total, code, timed_out = _run(config, request["command"], float(request["timeout_s"]))
  if timed_out:
    text += f"\n[the command ran past its {float(request['timeout_s']):g} s time limit and was killed]"
  elif code is not None and code < 0:
    text += f"\n[the command was killed by {signal.Signals(-code).name}]"
  return {"output": text, "exit_code": code, "timed_out": timed_out, "bytes": total}


def _resolve(path):
  """An absolute path inside the sandbox for `path` (relative ones are under /repo)."""
  if not isinstance(path, str) or not path.strip():
    raise ValueError("'path' must be a non-empty string")
  return os.path.normpath(os.path.join(REPO, path.strip()))


def _read_text(full):
  with open(full, "rb") as f:
    data = f.read(int(_read_text.max_bytes) + 1)
  if len(data) > _read_text.max_bytes:
    raise ValueError(f"{full} is larger than {_read_text.max_bytes} bytes")
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    raise ValueError(f"{full} is not UTF-8 text") from None


def op_view(config, request):
  full = _resolve(request.get("path"))
  if os.path.isdir(full):
    entries = []
    for root, dirs, files in os.walk(full):
      dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
      depth = root[len(full) :].count(os.sep)
      if depth >= 2:
        dirs[:] = []
      for name in sorted(files):
        entries.append(os.path.relpath(os.path.join(root, name), full))
    return {"output": f"{full}/ contains:\n" + "\n".join(entries[:500])}
  text = _read_text(full)
  lines = text.splitlines()
  start = max(1, int(request.get("start") or 1))
  end = request.get("end")
  end = len(lines) if end is None or int(end) <= 0 else min(len(lines), int(end))
  if start > max(1, len(lines)):
    raise ValueError(f"{full} has {len(lines)} lines; start {start} is past its end")
  shown = [f"{i:4d}  {lines[i - 1]}" for i in range(start, end + 1)]
  out = f"{full} (lines {start}-{end} of {len(lines)}):\n" + "\n".join(shown)
  return {"output": _clip(out, int(config["max_output_bytes"]))}


def _replace_once(full, old, new):
  """Replaces the one occurrence of `old` in file `full` by `new`; (new text, offset) or
  ValueError when `old` occurs 0 or several times."""
  if not os.path.isfile(full):
    raise ValueError(f"{full} is not a file")
  text = _read_text(full)
  count = text.count(old)
  if count == 0:
    raise ValueError(f"'old' was not found in {full} (0 matches); copy the exact text, indentation included, from view")
  if count > 1:
    raise ValueError(
      f"'old' occurs {count} times in {full}; include more surrounding lines so that it matches exactly once"
    )
  at = text.index(old)
  text = text[:at] + new + text[at + len(old) :]
  with open(full, "w", encoding="utf-8") as f:
    f.write(text)
  return text, at


def op_str_replace(config, request):
  full = _resolve(request.get("path"))
  old, new = request.get("old"), request.get("new")
  if not isinstance(old, str) or not old:
    raise ValueError("'old' must be a non-empty string (the exact text to replace)")
  if not isinstance(new, str):
    raise ValueError("'new' must be a string")
  text, at = _replace_once(full, old, new)
  first = text[:at].count("\n") + 1
  lines = text.splitlines()
  lo, hi = max(1, first - 3), min(len(lines), first + new.count("\n") + 3)
  snippet = "\n".join(f"{i:4d}  {lines[i - 1]}" for i in range(lo, hi + 1))
  return {"output": f"Edited {full} (1 replacement). Lines {lo}-{hi} now:\n{snippet}"}


def _tar_filter(info):
  parts = info.name.split("/")
  return None if any(p in _SKIP_DIRS for p in parts) else info


def op_load(config, request):
  data = base64.b64decode(request["tar_b64"])
  dest = request.get("dest", REPO)
  if dest not in (REPO, "/hidden_tests"):
    raise ValueError(f"cannot unpack into {dest!r}")
  with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
    members = archive.getmembers()
    if hasattr(tarfile, "data_filter"):
      archive.extractall(dest, filter="data")
    else:  # Python < 3.11.4: keep files, folders and links that stay inside
      safe = [
        m
        for m in members
        if (m.isfile() or m.isdir() or m.issym()) and not os.path.isabs(m.name) and ".." not in m.name.split("/")
      ]
      archive.extractall(dest, members=safe)
    count = sum(1 for m in members if m.isfile())
  edit = request.get("edit")
  if edit:  # the task's bug, made on the fresh copy
    _replace_once(os.path.join(dest, os.path.normpath(edit["path"])), edit["old"], edit["new"])
  return {"files": count}


def op_snapshot(config, request):
  _kill_others()  # nothing of the agent's may change the tree while it is read
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:
    archive.add(REPO, arcname=".", filter=_tar_filter)
  data = buffer.getvalue()
  if len(data) > int(request["max_bytes"]):
    raise ValueError(
      f"the repository's archive is {len(data)} bytes, over the {request['max_bytes']} byte limit for grading"
    )
  return {"tar_b64": base64.b64encode(data).decode("ascii")}


def op_grade(config, request):
  """Runs the hidden-test command; reads the per-test outcomes from its JUnit XML report."""
  junit = request["junit"]
  text, _, code, timed_out = _run(config, request["command"], float(request["timeout_s"]))
  cases = []
  try:
    root = ElementTree.parse(junit).getroot()
    for case in root.iter("testcase"):
      name = f"{case.get('classname', '')}::{case.get('name', '')}"
      outcome = "passed"
      for child in case:
        if child.tag in ("failure", "error"):
          outcome = child.tag
          break
        if child.tag == "skipped":
          outcome = "skipped"
      cases.append([name, outcome])
  except (OSError, ElementTree.ParseError):
    pass
  return {"cases": cases, "exit_code": code, "timed_out": timed_out, "output": text}


_OPS = {
  "bash": op_bash,
  "view": op_view,
  "str_replace": op_str_replace,
  "load": op_load,
  "snapshot": op_snapshot,
  "grade": op_grade,
}


def main():
  import sys

  config = json.loads(sys.argv[1])
  proto_in, proto_out = os.dup(0), os.dup(1)
  null = os.open("/dev/null", os.O_RDWR)
  for fd in (0, 1):  # fd 2 stays the host's capture of this driver's own errors
    os.dup2(null, fd)
  for fd in (proto_in, proto_out):
    os.set_inheritable(fd, False)
  _read_text.max_bytes = int(config["max_file_bytes"])
  set_rlimits(config)
  os.makedirs(REPO, exist_ok=True)
  send(proto_out, {"ready": True, "pid": os.getpid()})
  while True:
    request = receive(proto_in)
    if request is None:
      return
    op = request.get("op")
    if op == "ping":
      send(proto_out, {"pong": True})
      continue
    try:
      reply = _OPS[op](config, request)
    except KeyError as e:
      reply = {"error": f"missing field {e}"}
    except Exception as e:  # noqa: BLE001 -- the driver must answer, whatever the request did
      reply = {"error": str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"}
    send(proto_out, reply)


if __name__ == "__main__":
  main()
