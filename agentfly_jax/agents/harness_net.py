"""Inside an outside harness's sandbox (agents/harness_sandbox.py): the harness's one way out, then the harness.

  python -I -S -c "$(cat harness_net.py)" SOCKET PORT -- COMMAND [ARGS...]

The sandbox has a network namespace of its own, loopback only. This listens on 127.0.0.1:PORT there (the port
the harness's OPENAI_BASE_URL names) and carries every connection to the Unix socket SOCKET, the one path out
of the sandbox; the trainer's end of it carries the bytes on to the chain's endpoint. Then it runs COMMAND
and exits with its status (128 + N when signal N ended it) as soon as COMMAND exits: bubblewrap, the
namespace's init, ends with it, and the kernel kills every process left in the sandbox.

Standard library only: it runs with -I -S in the sandbox, where nothing of agentfly_jax is mounted.
"""

import socket
import subprocess
import sys
import threading


def pump(source: socket.socket, sink: socket.socket) -> None:
  """Copies bytes until `source` ends, then ends `sink`'s writing side."""
  try:
    while data := source.recv(65536):
      sink.sendall(data)
  except OSError:
    pass
  finally:
    try:
      sink.shutdown(socket.SHUT_WR)
    except OSError:
      pass


def carry(conn: socket.socket, path: str) -> None:
  """One connection of the harness, carried to the Unix socket `path` and back."""
  out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  try:
    out.connect(path)
  except OSError:
    conn.close()
    out.close()
    return
  back = threading.Thread(target=pump, args=(out, conn), daemon=True)
  back.start()
  pump(conn, out)
  back.join()
  conn.close()
  out.close()


def serve(listener: socket.socket, path: str) -> None:
  while True:
    conn, _ = listener.accept()
    threading.Thread(target=carry, args=(conn, path), daemon=True).start()


def main(argv: list[str]) -> int:
  if len(argv) < 4 or argv[2] != "--":
    print("harness_net: usage: harness_net.py SOCKET PORT -- COMMAND [ARGS...]", file=sys.stderr)
    return 125
  path, port, command = argv[0], int(argv[1]), argv[3:]
  listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  listener.bind(("127.0.0.1", port))
  listener.listen(128)
  threading.Thread(target=serve, args=(listener, path), daemon=True).start()
  try:
    code = subprocess.call(command)
  except OSError as e:
    print(f"harness_net: cannot run {command[0]!r}: {e}", file=sys.stderr)
    return 125
  return 128 - code if code < 0 else code


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
