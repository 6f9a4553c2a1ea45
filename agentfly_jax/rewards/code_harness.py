"""Runs INSIDE the python_sandbox (stdlib only; sent as code, its globals set first):
SUBMISSION (str), ENTRY_POINT (str), ARGS (list of argument lists), EXPECTED (list),
TIMEOUT_S (whole run), TEST_TIMEOUT_S (per test).

The submission runs in a child process of its own that receives only the test inputs; the
expected outputs stay in this process, which first makes itself non-dumpable so the child cannot
read its memory or descriptors through /proc. The child's results come back as JSON on a private
pipe; this process compares them and prints one JSON line:
  {"passed": int, "total": int, "error": str | None, "stderr": str (the child's, cut)}.
An infinite loop, a crash or a fork bomb ends in a kill of the child's process group at
TIMEOUT_S: the tests it did not answer fail.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile

_RUNNER = r'''
import json, os, signal, sys
out = os.fdopen(int(sys.argv[1]), "w")
request = json.loads(sys.stdin.read())
sys.stdin = open(os.devnull)
def on_alarm(signum, frame):
  raise TimeoutError("test ran past its time limit")
signal.signal(signal.SIGALRM, on_alarm)
namespace = {"__name__": "submission"}
try:
  exec(compile(request["code"], "<submission>", "exec"), namespace)
  fn = namespace[request["entry_point"]]
except BaseException as e:
  out.write(json.dumps({"load_error": type(e).__name__ + ": " + str(e)[:300]}) + "\n")
  out.flush()
  os._exit(0)
for args in request["args"]:
  signal.setitimer(signal.ITIMER_REAL, request["test_timeout_s"])
  try:
    value = fn(*args)
    signal.setitimer(signal.ITIMER_REAL, 0)
    line = json.dumps({"value": value})
  except BaseException as e:
    signal.setitimer(signal.ITIMER_REAL, 0)
    line = json.dumps({"error": type(e).__name__})
  out.write(line + "\n")
  out.flush()
os._exit(0)
'''


def _run():
  PR_SET_DUMPABLE = 4
  ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
  read_fd, write_fd = os.pipe()
  stderr_file = tempfile.TemporaryFile()
  child = subprocess.Popen(
    [sys.executable, "-u", "-c", _RUNNER, str(write_fd)],
    stdin=subprocess.PIPE,
    stdout=subprocess.DEVNULL,
    stderr=stderr_file,
    pass_fds=(write_fd,),
    start_new_session=True,
    cwd=tempfile.mkdtemp(),
  )
  os.close(write_fd)
  request = json.dumps(
    {
      "code": SUBMISSION,
      "entry_point": ENTRY_POINT,
      "args": ARGS,  # noqa: F821
      "test_timeout_s": TEST_TIMEOUT_S,
    }
  )  # noqa: F821
  error = None
  try:
    child.communicate(request.encode(), timeout=TIMEOUT_S)  # noqa: F821
  except subprocess.TimeoutExpired:
    error = "Timeout"
  except (BrokenPipeError, OSError):
    pass
  finally:
    try:
      os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    child.wait()
  os.set_blocking(read_fd, False)
  data = b""
  try:
    while True:
      chunk = os.read(read_fd, 1 << 16)
      if not chunk:
        break
      data += chunk
  except BlockingIOError:
    pass
  os.close(read_fd)
  results = []
  for line in data.decode("utf-8", "replace").splitlines():
    try:
      results.append(json.loads(line))
    except ValueError:
      results.append({"error": "garbled output"})
  if results and "load_error" in results[0]:
    error, results = results[0]["load_error"], []
  passed = 0
  for result, expected in zip(results, EXPECTED):  # noqa: F821
    if "value" in result and result["value"] == expected:
      passed += 1
  if error is None and len(results) < len(EXPECTED):  # noqa: F821
    error = (
      f"the submission's process ended after {len(results)} of {len(EXPECTED)} tests (exit status {child.returncode})"  # noqa: F821
    )
  stderr_file.seek(0)
  stderr = stderr_file.read(4000).decode("utf-8", "replace")
  print(
    json.dumps(
      {
        "passed": passed,
        "total": len(EXPECTED),
        "error": error,  # noqa: F821
        "stderr": stderr,
      }
    )
  )


if __name__ == "__main__":  # the sandbox runs it as a cell; importing it runs nothing
  _run()
