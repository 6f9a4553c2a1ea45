"""The child side of a subprocess env: `python -m envservers.worker MODULE:CLASS OPTIONS_JSON`.

Runs one instance of a `BlockingEnv` subclass (one with `run_in_subprocess = True`) in its own
process, so a crash, a hang or a leak in env code (a simulator, a JVM bridge) takes down only
that instance: the server kills and replaces the process. Requests arrive on stdin and replies
leave on the original stdout, both as envservers frames (4-byte length + JSON); the env's own
prints go to stderr, never into the protocol. Ops: reset {row}, step {action},
compute_reward {name, kwargs}, close. An env raising EnvCrashed (its simulator died) ends
the worker: the server then recycles the instance.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

from envservers.env import EnvCrashed, reward_method


def _read_exact(fd: int, n: int) -> bytes | None:
  chunks, got = [], 0
  while got < n:
    chunk = os.read(fd, n - got)
    if not chunk:
      return None
    chunks.append(chunk)
    got += len(chunk)
  return b"".join(chunks)


def _send(fd: int, message: dict) -> None:
  body = json.dumps(message).encode("utf-8")
  data = len(body).to_bytes(4, "big") + body
  while data:
    data = data[os.write(fd, data) :]


def _load(target: str):
  module_name, _, qualname = target.partition(":")
  obj = importlib.import_module(module_name)
  for part in qualname.split("."):
    obj = getattr(obj, part)
  return obj


def main(argv: list[str]) -> int:
  proto_in, proto_out = os.dup(0), os.dup(1)
  os.dup2(2, 1)  # env code printing to stdout must not corrupt the protocol
  sys.stdout = sys.stderr
  cls = _load(argv[0])
  env = cls(**json.loads(argv[1]))
  env.start_blocking()
  _send(proto_out, {"ready": True, "pid": os.getpid()})
  while True:
    header = _read_exact(proto_in, 4)
    if header is None:
      break
    body = _read_exact(proto_in, int.from_bytes(header, "big"))
    if body is None:
      break
    request = json.loads(body)
    op = request.get("op")
    try:
      if op == "reset":
        result = {"observation": env.reset_blocking(request.get("row"))}
      elif op == "step":
        result = env.step_blocking(request.get("action")).to_wire()
      elif op == "compute_reward":
        result = {"value": reward_method(env, request["name"])(**request.get("kwargs", {}))}
      elif op == "close":
        env.close_blocking()
        _send(proto_out, {"ok": True, "result": {}})
        break
      else:
        raise ValueError(f"unknown worker op {op!r}")
      _send(proto_out, {"ok": True, "result": result})
    except EnvCrashed as e:  # the env is unusable (e.g. its simulator died): report and exit
      traceback.print_exc()
      _send(proto_out, {"ok": False, "error": {"type": "EnvCrashed", "message": str(e)}})
      return 3
    except Exception as e:  # noqa: BLE001 -- reported to the server, which keeps serving
      traceback.print_exc()
      _send(proto_out, {"ok": False, "error": {"type": type(e).__name__, "message": str(e)}})
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
