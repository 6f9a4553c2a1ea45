"""Command line: python -m envservers --host 127.0.0.1 --port 8765 --env python_sandbox=16 ...

  --env NAME=CAP[:WARM]     serve env type NAME with at most CAP live instances, WARM of them
                            started ahead of demand (default min(CAP, 2)); repeatable.
  --env-opt NAME.KEY=VALUE  an option for env type NAME (VALUE parsed as JSON, else a string).
  --call-timeout-s NAME=S   wall-clock limit of one call of env type NAME (default: the type's
                            own); clients learn it at `acquire`.
  --import MODULE           import MODULE first (it registers env types with @register_env);
                            repeatable.
  --port 0                  picks a free port; the ready line on stdout says which.
  --token-file FILE         shared secret for the HMAC handshake (else $AGENTFLY_ENV_TOKEN_FILE
                            or $AGENTFLY_ENV_TOKEN); required unless --host is loopback.
  --tls-cert PEM --tls-key PEM   serve TLS (clients: $AGENTFLY_ENV_TLS_CA names the CA file).

When it is listening it prints one line `envservers listening on HOST:PORT` to stdout. SIGTERM or
SIGINT shut it down gracefully: it stops accepting, lets in-flight calls finish (up to
--grace-s), and closes every instance.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import os
import sys

import trio

from envservers import auth, protocol
from envservers.registry import ENV_TYPES
from envservers.server import EnvServer


def parse_env_spec(spec: str) -> tuple[str, int, int]:
  """'NAME=CAP[:WARM]' -> (name, cap, warm)."""
  name, sep, sizes = spec.partition("=")
  cap_text, _, warm_text = sizes.partition(":")
  try:
    cap = int(cap_text) if sep else 4
    warm = int(warm_text) if warm_text else min(cap, 2)
  except ValueError:
    raise ValueError(f"--env {spec!r}: expected NAME=CAP or NAME=CAP:WARM with integers") from None
  if not name or cap < 1 or not 0 <= warm <= cap:
    raise ValueError(f"--env {spec!r}: need a name, CAP >= 1 and 0 <= WARM <= CAP")
  return name, cap, warm


def parse_env_opt(spec: str) -> tuple[str, str, object]:
  """'NAME.KEY=VALUE' -> (name, key, value)."""
  target, sep, text = spec.partition("=")
  name, dot, key = target.partition(".")
  if not sep or not dot or not name or not key:
    raise ValueError(f"--env-opt {spec!r}: expected NAME.KEY=VALUE")
  try:
    value = json.loads(text)
  except ValueError:
    value = text
  return name, key, value


async def _shutdown_on_stdin_eof(server: EnvServer) -> None:
  stream = trio.lowlevel.FdStream(os.dup(0))
  try:
    while await stream.receive_some(4096):
      pass
  except (trio.BrokenResourceError, OSError):
    pass
  server.shutdown()


def main(argv: list[str] | None = None) -> int:
  import envservers.envs  # noqa: F401  (registers the built-in env types)

  parser = argparse.ArgumentParser(
    prog="python -m envservers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--host", default="127.0.0.1")
  parser.add_argument("--port", type=int, default=8765)
  parser.add_argument("--env", action="append", default=[], metavar="NAME=CAP[:WARM]")
  parser.add_argument("--env-opt", action="append", default=[], metavar="NAME.KEY=VALUE")
  parser.add_argument("--call-timeout-s", action="append", default=[], metavar="NAME=SECONDS")
  parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE")
  parser.add_argument("--max-frame-bytes", type=int, default=protocol.DEFAULT_MAX_FRAME_BYTES)
  parser.add_argument("--grace-s", type=float, default=5.0)
  parser.add_argument(
    "--token-file",
    default=None,
    help=f"file holding the shared secret (default: ${auth.TOKEN_FILE_ENV} or ${auth.TOKEN_ENV})",
  )
  parser.add_argument("--tls-cert", default=None, help="PEM certificate chain (with --tls-key)")
  parser.add_argument("--tls-key", default=None, help="PEM private key (with --tls-cert)")
  parser.add_argument("--log-level", default="WARNING")
  parser.add_argument(
    "--exit-on-stdin-eof", action="store_true", help="shut down when stdin closes (a parent that started us has exited)"
  )
  args = parser.parse_args(argv)
  logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
  for module in args.imports:
    try:
      importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 -- report any import failure by module name
      print(f"envservers: --import {module}: {type(e).__name__}: {e}", file=sys.stderr)
      return 2
  try:
    pools, options = {}, {}
    for spec in args.env or ["echo=4"]:
      name, cap, warm = parse_env_spec(spec)
      pools[name] = (cap, warm)
    for spec in args.env_opt:
      name, key, value = parse_env_opt(spec)
      if name not in pools:
        raise ValueError(f"--env-opt {spec!r}: env {name!r} is not served (add --env {name}=N)")
      options.setdefault(name, {})[key] = value
    call_timeout_s = {}
    for spec in args.call_timeout_s:
      name, _, seconds = spec.partition("=")
      try:
        call_timeout_s[name] = float(seconds)
      except ValueError:
        raise ValueError(f"--call-timeout-s {spec!r}: expected NAME=SECONDS") from None
      if name not in pools or not 0 < call_timeout_s[name] <= 3600:
        raise ValueError(f"--call-timeout-s {spec!r}: need a served env and 0 < SECONDS <= 3600")
  except (ValueError, KeyError, TypeError) as e:
    print(f"envservers: {e}; known env types: {sorted(ENV_TYPES)}", file=sys.stderr)
    return 2
  try:
    token = auth.load_token(args.token_file)
    auth.check_bind(args.host, token)
    if (args.tls_cert is None) != (args.tls_key is None):
      raise auth.AuthError("--tls-cert and --tls-key go together")
    ssl_context = auth.server_ssl_context(args.tls_cert, args.tls_key) if args.tls_cert else None
  except auth.AuthError as e:
    print(f"envservers: {e}", file=sys.stderr)
    return 2
  try:
    server = EnvServer(
      pools,
      env_options=options,
      max_frame_bytes=args.max_frame_bytes,
      call_timeout_s=call_timeout_s,
      token=token,
      ssl_context=ssl_context,
    )
  except (ValueError, KeyError, TypeError) as e:
    print(f"envservers: {e}; known env types: {sorted(ENV_TYPES)}", file=sys.stderr)
    return 2

  async def run():
    async with trio.open_nursery() as nursery:

      async def serve_then_stop(task_status=trio.TASK_STATUS_IGNORED):
        await server.serve(args.host, args.port, handle_signals=True, grace_s=args.grace_s, task_status=task_status)
        nursery.cancel_scope.cancel()

      port = await nursery.start(serve_then_stop)
      gc.freeze()  # start-up objects (imports, warm instances) leave the collector's scans
      print(f"envservers listening on {args.host}:{port}", flush=True)
      if args.exit_on_stdin_eof:
        nursery.start_soon(_shutdown_on_stdin_eof, server)

  trio.run(run)
  return 0


if __name__ == "__main__":
  sys.exit(main())
