"""Hostile outside harnesses for tests/agents/test_chain_timeout.py (standard library only, so they start
fast): each makes one chat request to its endpoint with urllib, then misbehaves.

  harness_hostile.py hang PIDFILE      leaves a detached daemon (double fork + setsid; its pid in PIDFILE),
                                       then never exits
  harness_hostile.py daemon PIDFILE    leaves a detached daemon that keeps stdout open, answers, exits 0
  harness_hostile.py env OUTFILE       writes its environment, argv and stdin to OUTFILE as JSON, answers
"""

import json
import os
import sys
import time
import urllib.request

ANSWER = "the harness's answer"


def one_request(question: str) -> str:
  body = {"model": "policy", "messages": [{"role": "user", "content": question}]}
  request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "Content-Type": "application/json"},
  )
  with urllib.request.urlopen(request, timeout=60) as reply:
    return json.load(reply)["choices"][0]["message"]["content"] or ""


def detached_daemon(pidfile: str) -> None:
  """A grandchild in a session of its own (orphaned: its parent exits), stdout inherited; returns once its
  pid is written."""
  ready_r, ready_w = os.pipe()
  if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
      with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
      os.rename(pidfile + ".tmp", pidfile)
      os.write(ready_w, b"x")
      time.sleep(300)
      os._exit(0)
    os._exit(0)
  os.read(ready_r, 1)


def main(mode: str, path: str) -> None:
  stdin = sys.stdin.read()
  row = json.loads(stdin)
  one_request(row["question"])
  if mode == "hang":
    detached_daemon(path)
    time.sleep(300)
  elif mode == "daemon":
    detached_daemon(path)
    print(ANSWER, flush=True)
  elif mode == "env":
    with open(path, "w") as f:
      json.dump({"env": dict(os.environ), "argv": sys.argv, "stdin": stdin}, f)
    print(ANSWER, flush=True)
  else:
    raise SystemExit(f"harness_hostile.py: unknown mode {mode!r}")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
