"""The interpreter loop that runs INSIDE the bubblewrap sandbox (stdlib only; driver_common.py
inlined by the host).

Started as `python -c <this file's source> <config json>`. It keeps one namespace for the whole
episode (state persists across calls), reads requests from fd 0 and writes replies to fd 1, both
as 4-byte big-endian length + JSON frames, after moving them to private descriptors: user code
sees /dev/null as stdin and two memfds as stdout/stderr, which are read back and truncated after
each call. It lowers its own rlimits at start (address space, processes, file size, CPU time:
the CPU limit is re-armed per call as used + cpu_s). A per-call alarm (`timeout_s`) raises
TimeoutError inside the running code, so a runaway cell is interrupted and the interpreter keeps
its state; code that swallows it is killed by the host a little later. Requests:
  {"op": "exec", "code": str, "timeout_s": float}
      ->  {"stdout", "stderr", "stdout_bytes", "stderr_bytes",
                                     "value": repr of a trailing expression or None,
                                     "error": exception type name or None}
  {"op": "ping"}               ->  {"pong": true}
"""

import ast
import builtins
import io
import json
import os
import resource
import signal
import sys
import traceback

from envservers.envs.driver_common import read_exact, receive, send, set_rlimits


class _CappedStream(io.TextIOBase):
  """A text stream writing to an fd until `cap` bytes, then only counting."""

  def __init__(self, fd, cap):
    self._fd, self._cap, self.written, self.dropped = fd, cap, 0, 0

  def writable(self):
    return True

  def write(self, text):
    data = str(text).encode("utf-8", "replace")
    room = max(0, self._cap - self.written)
    if room:
      part = data[:room]
      while part:
        part = part[os.write(self._fd, part) :]
    self.written += min(room, len(data))
    self.dropped += len(data) - min(room, len(data))
    return len(text)

  def flush(self):
    pass

  @property
  def encoding(self):
    return "utf-8"


def _collect(fd, cap, dropped):
  size = os.fstat(fd).st_size
  os.lseek(fd, 0, os.SEEK_SET)
  data = read_exact(fd, min(size, cap)) or b""
  os.ftruncate(fd, 0)
  os.lseek(fd, 0, os.SEEK_SET)
  total = size + dropped
  text = data.decode("utf-8", "replace")
  if total > len(data):
    text += f"\n... [output truncated: {total} bytes in all, first {len(data)} shown]\n"
  return text, total


def _run(code, namespace, my_pid):
  """Executes `code`; returns (repr of a trailing expression or None, error type or None).

  A process forked by the code that gets back here exits at once, silently (only the
  interpreter itself answers).
  """
  try:
    tree = ast.parse(code, filename="<cell>", mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
      last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
      value = eval(compile(last, "<cell>", "eval"), namespace)
      if value is not None:
        return repr(value), None
    return None, None
  except SystemExit as e:
    if os.getpid() != my_pid:
      os._exit(e.code if isinstance(e.code, int) else 1)
    sys.stderr.write(f"SystemExit: {e.code!r} (the interpreter keeps running)\n")
    return None, "SystemExit"
  except BaseException as e:  # noqa: BLE001 -- user code may raise anything
    if os.getpid() != my_pid:
      os._exit(1)
    name = type(e).__name__
    try:
      tb = e.__traceback__
      while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
        tb = tb.tb_next
      sys.stderr.write("".join(traceback.format_exception(type(e), e, tb)))
    except BaseException:  # noqa: BLE001 -- e.g. no memory left to format it: say the least
      try:
        os.write(2, f"{name} (traceback unavailable)\n".encode())
      except OSError:
        pass
    return None, name


def _on_alarm(signum, frame):
  raise TimeoutError(
    f"the code ran past its {_on_alarm.limit:g} s time limit and was interrupted (variables defined so far are kept)"
  )


def main():
  config = json.loads(sys.argv[1])
  cap = int(config["max_output_bytes"])
  proto_in = os.dup(0)
  proto_out = os.dup(1)
  null = os.open("/dev/null", os.O_RDONLY)
  os.dup2(null, 0)
  out_fd = os.memfd_create("stdout")
  err_fd = os.memfd_create("stderr")
  os.dup2(out_fd, 1)
  os.dup2(err_fd, 2)
  for fd in (proto_in, proto_out, out_fd, err_fd):
    os.set_inheritable(fd, False)
  set_rlimits(config)
  cpu_hard = int(config["cpu_total_s"])
  resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))
  my_pid = os.getpid()
  namespace = {"__name__": "__main__", "__builtins__": builtins}
  send(proto_out, {"ready": True, "pid": my_pid})
  while True:
    request = receive(proto_in)
    if request is None:
      return
    if request.get("op") == "ping":
      send(proto_out, {"pong": True})
      continue
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = min(cpu_hard, int(usage.ru_utime + usage.ru_stime + config["cpu_s"]) + 1)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
    out = sys.stdout = _CappedStream(1, cap)
    err = sys.stderr = _CappedStream(2, cap)
    _on_alarm.limit = float(request.get("timeout_s") or config["timeout_s"])
    signal.signal(signal.SIGALRM, _on_alarm)  # re-installed: user code may have replaced it
    signal.setitimer(signal.ITIMER_REAL, _on_alarm.limit)
    try:
      value, error = _run(request["code"], namespace, my_pid)
    except BaseException as e:  # noqa: BLE001 -- the loop itself must survive (e.g. MemoryError)
      value, error = None, type(e).__name__
    finally:
      if os.getpid() != my_pid:  # a fork of user code must never answer
        os._exit(0)
      signal.setitimer(signal.ITIMER_REAL, 0)
    if value is not None and len(value) > cap:
      value = value[:cap] + f"... [repr truncated: {len(value)} characters]"
    stdout, stdout_bytes = _collect(out_fd, cap, out.dropped)
    stderr, stderr_bytes = _collect(err_fd, cap, err.dropped)
    send(
      proto_out,
      {
        "stdout": stdout,
        "stderr": stderr,
        "stdout_bytes": stdout_bytes,
        "stderr_bytes": stderr_bytes,
        "value": value,
        "error": error,
      },
    )


if __name__ == "__main__":
  main()
