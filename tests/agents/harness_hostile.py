"""Hostile outside harnesses for tests/agents/test_chain_timeout.py and test_harness_sandbox.py (standard
library only, so they start fast and need nothing mounted but the interpreter): each makes one chat request
to its endpoint with urllib (the row from stdin), then misbehaves. What it found is its answer (stdout, JSON).

  harness_hostile.py hang MARKER      leaves a detached daemon (double fork + setsid, MARKER in its argv), then
                                      never exits
  harness_hostile.py daemon MARKER    leaves a detached daemon that keeps stdout open, answers, exits 0
  harness_hostile.py env              answers its environment, argv and stdin
  harness_hostile.py proc             answers the pids it sees and every chain key it could read in /proc
  harness_hostile.py reach PORT       answers whether it could connect to 127.0.0.1:PORT and the endpoint's host
  harness_hostile.py steal            sends one request with the key in its row's `other_key`: answers the status
  harness_hostile.py read PATH        answers whether it could read PATH
  harness_hostile.py flood MB         writes MB megabytes of "x" to stdout and to stderr, then exits 0
"""

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

ANSWER = "the harness's answer"


def request(question: str, key: str) -> int:
  body = {"model": "policy", "messages": [{"role": "user", "content": question}]}
  req = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
  )
  try:
    with urllib.request.urlopen(req, timeout=60) as reply:
      return reply.status
  except urllib.error.HTTPError as e:
    return e.code


def detached_daemon(marker: str) -> None:
  """A grandchild in a session of its own (orphaned: its parent exits), stdout inherited, MARKER in its argv
  (so the test finds it in the host's /proc, whatever pid namespace it is in); returns once it runs."""
  ready_r, ready_w = os.pipe()
  if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
      os.write(ready_w, b"x")
      os.execv(sys.executable, [sys.executable, "-S", "-c", "import time; time.sleep(300)", marker])
    os._exit(0)
  os.read(ready_r, 1)
  time.sleep(0.2)  # the exec has happened


def keys_in_proc() -> tuple[list[int], list[str]]:
  pids, keys = [], set()
  for name in os.listdir("/proc"):
    if name.isdigit():
      pids.append(int(name))
      try:
        with open(f"/proc/{name}/environ", "rb") as f:
          environ = f.read().decode(errors="replace")
      except OSError:
        continue
      keys |= {w.split("=", 1)[1] for w in environ.split("\0") if w.startswith("OPENAI_API_KEY=")}
  return pids, sorted(keys)


def can_connect(host: str, port: int) -> bool:
  try:
    socket.create_connection((host, port), timeout=2).close()
    return True
  except OSError:
    return False


def main(mode: str, arg: str) -> None:
  stdin = sys.stdin.read()
  row = json.loads(stdin)
  key = os.environ["OPENAI_API_KEY"]
  status = request(row["question"], key)
  if mode == "hang":
    detached_daemon(arg)
    time.sleep(300)
  elif mode == "daemon":
    detached_daemon(arg)
    print(ANSWER, flush=True)
  elif mode == "env":
    print(json.dumps({"env": dict(os.environ), "argv": sys.argv, "stdin": stdin, "status": status}))
  elif mode == "proc":
    time.sleep(float(row.get("linger", 0)))  # the other chains' harnesses run meanwhile
    pids, keys = keys_in_proc()
    print(json.dumps({"pids": pids, "keys": keys, "own": key}))
  elif mode == "reach":
    endpoint = urllib.parse.urlsplit(os.environ["OPENAI_BASE_URL"])
    print(
      json.dumps({"other": can_connect("127.0.0.1", int(arg)), "endpoint": can_connect("127.0.0.1", endpoint.port)})
    )
  elif mode == "steal":
    print(json.dumps({"own": status, "stolen": request(row["question"], row["other_key"])}))
  elif mode == "read":
    try:
      with open(arg) as f:
        print(json.dumps({"read": f.read()}))
    except OSError as e:
      print(json.dumps({"error": type(e).__name__}))
  elif mode == "flood":
    chunk = "x" * (1 << 20)
    for _ in range(int(arg)):
      sys.stdout.write(chunk)
      sys.stderr.write(chunk)
  else:
    raise SystemExit(f"harness_hostile.py: unknown mode {mode!r}")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
