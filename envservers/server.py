"""The trio env server: accepts connections, decodes frames, dispatches ops to env pools.

Each connection runs a reader loop; every request runs in its own task (so a slow env call never
blocks other requests on the same connection) and replies are written under a send lock. A chain
is identified by (connection, env, chain_id): chains die with their connection, so a crashed
trainer never leaks instances. See PROTOCOL.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import time
import uuid
from typing import Any

import trio

from envservers import auth, images, protocol
from envservers.env import EnvCrashed, StepOutcome
from envservers.registry import ENV_TYPES, make_factory
from envservers.pool import CallTimeout, EnvPool, PoolError

log = logging.getLogger("envservers")
MAX_CHAIN_ID_CHARS = 1024
_DECODE_IN_THREAD_BYTES = 1024 * 1024
_CHECK_IN_THREAD_CHARS = 256 * 1024
_REPLY_RESERVE_BYTES = 64 * 1024  # room in a reply frame for everything besides the observation
_connection_ids = itertools.count(1)


def _arg(args: dict, name: str, types, *, required: bool = True, default=None):
  if name not in args:
    if required:
      raise PoolError(protocol.BAD_REQUEST, f"missing argument {name!r}")
    return default
  value = args[name]
  if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
    names = "/".join(t.__name__ for t in _as_tuple(types))
    raise PoolError(protocol.BAD_REQUEST, f"argument {name!r} must be {names}, got {type(value).__name__}")
  return value


def _as_tuple(types):
  return types if isinstance(types, tuple) else (types,)


class _Connection:
  def __init__(self, stream: trio.SocketStream, max_frame_bytes: int):
    self.id = next(_connection_ids)
    self.stream = stream
    self.writer = protocol.FrameWriter(stream, on_sent=self.wake_reader)
    self.max_frame_bytes = max_frame_bytes
    self.keys: dict[str, set] = {}  # env name -> keys of chains acquired on this connection
    self.closed = False
    self.flushed = trio.Event()  # the writer has sent everything and stopped
    self.inflight = 0
    self.room = trio.Event()  # set when a request finishes or replies were sent

  def wake_reader(self) -> None:
    self.room.set()

  def send(self, message: dict[str, Any]) -> None:
    """Queues one reply (never waits, never raises; the connection's writer task sends it)."""
    try:
      frame = protocol.encode_frame(message, self.max_frame_bytes)
    except protocol.ProtocolError as e:
      frame = _encode_error(message.get("id"), e.error_type, e.message)
    except Exception as e:  # noqa: BLE001 -- an env returned something JSON cannot encode
      frame = _encode_error(
        message.get("id"),
        protocol.ENV_ERROR,
        f"result is not JSON-serialisable: {type(e).__name__}: {protocol.short_text(e)}",
      )
    if not self.closed and not self.writer.closed:
      self.writer.put(frame)

  async def write_loop(self) -> None:
    try:
      await self.writer.run()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
      self.closed = True
    finally:
      self.flushed.set()


class EnvServer:
  """Serves env pools over TCP.

  Args:
    pools: {env name: (cap, warm)}.
    env_options: {env name: {option: value}} passed to each instance's constructor.
    max_frame_bytes: frames above this get a FrameTooLarge error and the connection is closed.
    max_inflight_per_connection, max_queued_reply_bytes: back-pressure; past either, the server
      stops reading that connection's requests until some finish / its replies are sent.
    limits: what one frame body may hold (nesting, string/array sizes, value count).
    token: shared secret; when set, every connection must pass the HMAC handshake (auth.py)
      before its first request. `serve` refuses a non-loopback host without one.
    ssl_context: serve TLS (auth.server_ssl_context) instead of plain TCP.
    handshake_timeout_s: a connection that has not finished TLS + authentication by then is
      closed.
    image_limits: what an observation's images may cost (envservers.images); one over them is a
      BadObservation (an error observation for `step`), and the server serves on.
  """

  def __init__(
    self,
    pools: dict[str, tuple[int, int]],
    env_options: dict[str, dict] | None = None,
    max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES,
    call_timeout_s: dict[str, float] | None = None,
    max_inflight_per_connection: int = 16384,
    max_queued_reply_bytes: int = 64 * 1024 * 1024,
    limits: protocol.DecodeLimits = protocol.DEFAULT_LIMITS,
    token: bytes | None = None,
    ssl_context=None,
    handshake_timeout_s: float = 10.0,
    image_limits: images.ImageLimits = images.DEFAULT_IMAGE_LIMITS,
  ):
    env_options = env_options or {}
    call_timeout_s = call_timeout_s or {}
    self.pools: dict[str, EnvPool] = {}
    for name, (cap, warm) in pools.items():
      if name not in ENV_TYPES:
        raise KeyError(f"unknown env type {name!r}; known: {sorted(ENV_TYPES)}")
      factory = make_factory(name, dict(env_options.get(name, {})))
      self.pools[name] = EnvPool(name, factory, cap=cap, warm=warm, call_timeout_s=call_timeout_s.get(name))
    self.max_frame_bytes = max_frame_bytes
    self.max_inflight_per_connection = max_inflight_per_connection
    self.max_queued_reply_bytes = max_queued_reply_bytes
    self.limits = limits
    self.token = token
    self.ssl_context = ssl_context
    self.handshake_timeout_s = handshake_timeout_s
    self.image_limits = image_limits
    self.server_id = uuid.uuid4().hex
    self.started = time.monotonic()
    # frames: bodies read; bad_frames: bodies that are not a JSON object within the limits;
    # frames_too_large / truncated_frames: length over the limit / stream ended inside a frame
    # (both close the connection); connection_errors / internal_errors: bugs contained per
    # connection / per request (stay 0 unless something is wrong here).
    self.counters = {
      key: 0
      for key in (
        "connections",
        "open_connections",
        "frames",
        "requests",
        "bad_frames",
        "frames_too_large",
        "truncated_frames",
        "errors",
        "auth_ok",
        "auth_failures",
        "tls_failures",
        "connection_errors",
        "internal_errors",
      )
    }
    self.inflight = 0
    self._shutdown = trio.Event()
    self._idle = trio.Event()
    self.listeners: list[trio.SocketListener] = []
    self._connections: set[_Connection] = set()

  # -- public -----------------------------------------------------------------------------------

  async def serve(
    self,
    host: str,
    port: int,
    *,
    task_status=trio.TASK_STATUS_IGNORED,
    handle_signals: bool = False,
    grace_s: float = 5.0,
  ) -> None:
    """Serves until `shutdown()` (or SIGTERM/SIGINT with handle_signals); then drains in-flight
    requests for up to `grace_s` and closes every instance. task_status gets the bound port.
    Raises auth.AuthError if `host` is not loopback and the server has no token."""
    auth.check_bind(host, self.token)
    total = sum(p.cap for p in self.pools.values())
    limiter = trio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(limiter.total_tokens, total + 8)
    async with trio.open_nursery() as pool_nursery:
      for pool in self.pools.values():
        pool.start(pool_nursery)
      self.listeners = await trio.open_tcp_listeners(port, host=host)
      bound_port = self.listeners[0].socket.getsockname()[1]
      async with trio.open_nursery() as conn_nursery:
        if handle_signals:
          conn_nursery.start_soon(self._watch_signals)
        accept_scope = trio.CancelScope()

        async def accept():
          with accept_scope:
            await trio.serve_listeners(self._handle_connection, self.listeners, handler_nursery=conn_nursery)

        conn_nursery.start_soon(accept)
        task_status.started(bound_port)
        await self._shutdown.wait()
        accept_scope.cancel()  # stop accepting; open connections keep being served
        with trio.move_on_after(grace_s):
          while self.inflight:
            self._idle = trio.Event()
            await self._idle.wait()
          for conn in list(self._connections):  # send the replies already queued
            conn.writer.close()
          for conn in list(self._connections):
            await conn.flushed.wait()
        conn_nursery.cancel_scope.cancel()
      for listener in self.listeners:
        await listener.aclose()
      for pool in self.pools.values():
        await pool.aclose()
      pool_nursery.cancel_scope.cancel()

  def shutdown(self) -> None:
    self._shutdown.set()

  async def _watch_signals(self) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
      async for signum in signals:
        log.info("envservers: got signal %s, shutting down", signum)
        self.shutdown()
        return

  def health(self) -> dict[str, Any]:
    return {
      "status": "shutting_down" if self._shutdown.is_set() else "ok",
      "server_id": self.server_id,
      "pid": os.getpid(),
      "uptime_s": time.monotonic() - self.started,
      "envs": {name: {"cap": p.cap, "rewards": ENV_TYPES[name].reward_names()} for name, p in self.pools.items()},
    }

  def stats(self) -> dict[str, Any]:
    return {
      **self.health(),
      **self.counters,
      "inflight": self.inflight,
      "pools": {name: p.stats() for name, p in self.pools.items()},
    }

  # -- connections ------------------------------------------------------------------------------

  async def _handle_connection(self, stream: trio.SocketStream) -> None:
    """One connection's whole life. Never raises (but Cancelled) into the server's nursery:
    whatever goes wrong here closes this connection only and is counted."""
    self.counters["connections"] += 1
    self.counters["open_connections"] += 1
    conn = None
    try:
      if self.ssl_context is not None:
        tls = await self._start_tls(stream)
        if tls is None:
          return
        stream = tls
      conn = _Connection(stream, self.max_frame_bytes)
      self._connections.add(conn)
      await self._serve_connection(conn)
    except Exception:  # noqa: BLE001 -- containment: a bug must not take the server down
      self.counters["connection_errors"] += 1
      log.exception("envservers: connection handler failed (connection closed)")
    finally:
      self.counters["open_connections"] -= 1
      try:
        if conn is not None:
          conn.closed = True
          self._connections.discard(conn)
          for env_name, keys in conn.keys.items():
            self.pools[env_name].release_all(keys)
      except Exception:  # noqa: BLE001
        self.counters["connection_errors"] += 1
        log.exception("envservers: releasing a closed connection's chains failed")
      with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(stream)

  async def _start_tls(self, stream):
    tls = trio.SSLStream(stream, self.ssl_context, server_side=True)
    try:
      with trio.fail_after(self.handshake_timeout_s):
        await tls.do_handshake()
    except (trio.BrokenResourceError, trio.TooSlowError, OSError):
      self.counters["tls_failures"] += 1
      return None
    return tls

  async def _serve_connection(self, conn: _Connection) -> None:
    reader = protocol.FrameReader(conn.stream, self.max_frame_bytes)
    async with trio.open_nursery() as writer_nursery:
      writer_nursery.start_soon(conn.write_loop)
      nonce = auth.new_nonce()
      conn.send(
        {
          "hello": {
            "protocol": 1,
            "auth": None if self.token is None else auth.SCHEME,
            "nonce": nonce,
            "server_id": self.server_id,
          }
        }
      )
      if self.token is None or await self._authenticate(conn, reader, nonce):
        async with trio.open_nursery() as requests:
          if not await self._read_requests(conn, reader, requests):
            requests.cancel_scope.cancel()  # the client is gone: stop its in-flight calls
      # No more requests and every in-flight one has queued its reply: flush, then close.
      conn.writer.close()

  async def _authenticate(self, conn: _Connection, reader: protocol.FrameReader, nonce: str) -> bool:
    """The server side of the handshake (auth.py) after the hello carrying `nonce`: True if the
    client proved the secret; else it got one error reply and the connection is to be closed."""
    request, request_id = None, None
    with trio.move_on_after(self.handshake_timeout_s):
      try:
        body = await reader.read_body()
        request = None if body is None else protocol.decode_body(body, self.limits)
      except (protocol.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        request = None
    self.counters["auth_failures"] += 1  # undone below on success
    if not isinstance(request, dict):
      conn.send(
        _error_reply(
          None,
          protocol.AUTH_REQUIRED,
          "this server needs authentication: the first frame must be an `auth` request (see PROTOCOL.md)",
        )
      )
      return False
    request_id = request.get("id")
    if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
      request_id = None
    args = request.get("args")
    if request.get("op") != "auth" or not isinstance(args, dict):
      conn.send(
        _error_reply(
          request_id,
          protocol.AUTH_REQUIRED,
          f"this server needs authentication: got op {protocol.short_repr(request.get('op'))} before `auth`",
        )
      )
      return False
    client_nonce = args.get("client_nonce")
    if not isinstance(client_nonce, str) or not 16 <= len(client_nonce) <= 256 or not client_nonce.isascii():
      conn.send(
        _error_reply(
          request_id, protocol.AUTH_FAILED, "argument 'client_nonce' must be an ASCII string of 16-256 chars"
        )
      )
      return False
    if not auth.macs_equal(auth.client_mac(self.token, nonce, client_nonce), args.get("mac")):
      conn.send(
        _error_reply(request_id, protocol.AUTH_FAILED, "authentication failed: wrong token (or a replayed handshake)")
      )
      return False
    self.counters["auth_failures"] -= 1
    self.counters["auth_ok"] += 1
    conn.send(
      {"id": request_id, "ok": True, "result": {"server_mac": auth.server_mac(self.token, nonce, client_nonce)}}
    )
    return True

  async def _read_requests(self, conn: _Connection, reader: protocol.FrameReader, requests: trio.Nursery) -> bool:
    """Reads and starts requests until the stream ends; True if the client may still read."""
    while not conn.closed:
      while conn.inflight >= self.max_inflight_per_connection or conn.writer.queued_bytes > self.max_queued_reply_bytes:
        conn.room = trio.Event()
        await conn.room.wait()
      try:
        body = await reader.read_body()
      except protocol.ProtocolError as e:
        key = "frames_too_large" if e.error_type == protocol.FRAME_TOO_LARGE else "truncated_frames"
        self.counters[key] += 1
        conn.send(_error_reply(None, e.error_type, e.message))
        return True  # framing is lost: answer what is in flight, then close
      except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return False
      if body is None:
        return False
      self.counters["frames"] += 1
      try:
        if len(body) > _DECODE_IN_THREAD_BYTES:  # keep the event loop serving other clients
          request = await trio.to_thread.run_sync(protocol.decode_body, body, self.limits)
        else:
          request = protocol.decode_body(body, self.limits)
      except protocol.ProtocolError as e:
        self.counters["bad_frames"] += 1
        conn.send(_error_reply(None, e.error_type, e.message))
        continue
      self.inflight += 1
      conn.inflight += 1
      requests.start_soon(self._run_request, conn, request)
    return False

  async def _run_request(self, conn: _Connection, request: dict[str, Any]) -> None:
    try:
      try:
        reply = await self._reply_to(conn, request)
      except Exception as e:  # noqa: BLE001 -- containment: a bug answers this request only
        self.counters["internal_errors"] += 1
        log.exception("envservers: request handling failed")
        reply = _error_reply(request.get("id"), protocol.INTERNAL, f"{type(e).__name__}: {protocol.short_text(e)}")
      conn.send(reply)
    finally:
      self.inflight -= 1
      conn.inflight -= 1
      conn.wake_reader()
      if not self.inflight:
        self._idle.set()

  async def _reply_to(self, conn: _Connection, request: dict[str, Any]) -> dict[str, Any]:
    request_id = request.get("id")
    try:
      self.counters["requests"] += 1
      if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
        raise PoolError(protocol.BAD_REQUEST, "field 'id' must be an int or string")
      op = request.get("op")
      if not isinstance(op, str):
        raise PoolError(protocol.BAD_REQUEST, "field 'op' must be a string")
      args = request.get("args", {})
      if not isinstance(args, dict):
        raise PoolError(protocol.BAD_REQUEST, f"field 'args' must be an object, got {type(args).__name__}")
      handler = _OPS.get(op)
      if handler is None:
        raise PoolError(protocol.UNKNOWN_OP, f"unknown op {protocol.short_repr(op)}; ops: {sorted(_OPS)}")
      if self._shutdown.is_set() and op == "acquire":
        raise PoolError(protocol.SHUTTING_DOWN, "server is shutting down")
      return {"id": request_id, "ok": True, "result": await handler(self, conn, args)}
    except PoolError as e:
      error_type, message = e.error_type, e.message
    except CallTimeout as e:
      error_type, message = "Timeout", str(e)
    except EnvCrashed as e:
      error_type, message = "EnvCrashed", str(e)
    except Exception as e:  # an env raised: report it and keep serving
      error_type = protocol.ENV_ERROR
      message = f"{type(e).__name__}: {protocol.short_text(e, 2000)}"
    self.counters["errors"] += 1
    return _error_reply(request_id, error_type, message)

  # -- ops --------------------------------------------------------------------------------------

  def _pool(self, args: dict) -> EnvPool:
    env_name = _arg(args, "env", str)
    if env_name not in self.pools:
      raise PoolError(
        protocol.UNKNOWN_ENV,
        f"env type {protocol.short_repr(env_name)} is not served here; served: {sorted(self.pools)}",
      )
    return self.pools[env_name]

  def _key(self, conn: _Connection, args: dict) -> tuple:
    chain_id = _arg(args, "chain_id", (str, int))
    if isinstance(chain_id, str) and len(chain_id) > MAX_CHAIN_ID_CHARS:
      raise PoolError(
        protocol.BAD_REQUEST, f"argument 'chain_id' has {len(chain_id)} characters; the limit is {MAX_CHAIN_ID_CHARS}"
      )
    return (conn.id, str(chain_id))

  async def _op_health(self, conn, args):
    return self.health()

  async def _op_stats(self, conn, args):
    return self.stats()

  async def _op_acquire(self, conn, args):
    pool, key = self._pool(args), self._key(conn, args)
    wait_s = float(_arg(args, "wait_s", (int, float), required=False, default=0.0))
    if not 0 <= wait_s <= 600:
      raise PoolError(protocol.BAD_REQUEST, f"argument 'wait_s' must be in [0, 600], got {wait_s}")
    inst = await pool.acquire(key, wait_s=wait_s)
    if conn.closed:  # the client went away while we waited
      await pool.release(key)
      raise PoolError(protocol.BAD_REQUEST, "connection closed")
    conn.keys.setdefault(pool.name, set()).add(key)
    return {
      "instance_id": inst.id,
      "worker_pid": inst.env.worker_pid,
      "call_timeout_s": pool.call_timeout_s or inst.env.call_timeout_s,
    }

  async def _op_release(self, conn, args):
    pool, key = self._pool(args), self._key(conn, args)
    conn.keys.get(pool.name, set()).discard(key)
    return {"released": await pool.release(key)}

  async def _op_reset(self, conn, args):
    pool, key = self._pool(args), self._key(conn, args)
    row = _arg(args, "row", (dict, type(None)), required=False)
    timeout_s = _timeout_arg(args)
    observation, restarted = await pool.call(key, "reset", (row,), timeout_s=timeout_s)
    problem = await self._observation_problem(observation)
    if problem:
      raise PoolError(protocol.BAD_OBSERVATION, f"env {pool.name!r} reset returned a bad observation: {problem}")
    return {"observation": observation, "restarted": restarted}

  async def _observation_problem(self, observation) -> str | None:
    """None if `observation` is a str or a list of valid parts within the image limits and fits a
    reply frame; else what is wrong (images.check_observation; big images are checked in a thread)."""
    size = images.part_chars(observation)
    try:
      if size > _CHECK_IN_THREAD_CHARS:
        await trio.to_thread.run_sync(images.check_observation, observation, self.image_limits)
      else:
        images.check_observation(observation, self.image_limits)
    except images.ObservationError as e:
      return str(e)
    if size > self.max_frame_bytes - _REPLY_RESERVE_BYTES:
      return f"an observation of {size:,} characters; a reply frame holds at most {self.max_frame_bytes:,} bytes"
    return None

  async def _op_step(self, conn, args):
    pool, key = self._pool(args), self._key(conn, args)
    if "action" not in args:
      raise PoolError(protocol.BAD_REQUEST, "missing argument 'action'")
    timeout_s = _timeout_arg(args)
    try:
      outcome, restarted = await pool.call(key, "step", (args["action"],), timeout_s=timeout_s)
    except (EnvCrashed, CallTimeout) as e:
      # A step never raises to the chain: the failure is its observation.
      kind = "Timeout" if isinstance(e, CallTimeout) else "EnvCrashed"
      return {
        "observation": f"Error ({kind}): {e}. The environment was restarted; its state (variables, files) is lost.",
        "reward": None,
        "done": False,
        "info": {"error": kind},
      }
    if not isinstance(outcome, StepOutcome):
      raise TypeError(f"env {pool.name!r} step returned {type(outcome).__name__}, not StepOutcome")
    result = outcome.to_wire()
    problem = await self._observation_problem(outcome.observation)
    if problem:  # like other env failures: an error observation, the episode's reward and end kept
      result["observation"] = f"Error ({protocol.BAD_OBSERVATION}): env {pool.name!r} returned {problem}"
      result["info"] = {**result["info"], "error": protocol.BAD_OBSERVATION}
    if restarted:
      note = "[note: the environment had crashed and was restarted; earlier state is lost]\n"
      result["info"] = {**result["info"], "restarted": True}
      obs = result["observation"]
      result["observation"] = note + obs if isinstance(obs, str) else [images.text_part(note), *obs]
    return result

  async def _op_compute_reward(self, conn, args):
    pool, key = self._pool(args), self._key(conn, args)
    name = _arg(args, "name", str)
    kwargs = _arg(args, "kwargs", dict, required=False, default={})
    result, _ = await pool.call(key, "compute_reward", (name,), kwargs, timeout_s=_timeout_arg(args))
    return result


def _timeout_arg(args: dict) -> float | None:
  value = _arg(args, "timeout_s", (int, float, type(None)), required=False)
  if value is not None and not 0 < value <= 3600:
    raise PoolError(protocol.BAD_REQUEST, f"argument 'timeout_s' must be in (0, 3600], got {value}")
  return value


def _error_reply(request_id, error_type: str, message: str) -> dict[str, Any]:
  return {"id": request_id, "ok": False, "error": {"type": error_type, "message": message}}


def _encode_error(request_id, error_type: str, message: str) -> bytes:
  """An error reply frame; drops the id if even that cannot be encoded."""
  try:
    return protocol.encode_frame(_error_reply(request_id, error_type, message))
  except Exception:  # noqa: BLE001
    return protocol.encode_frame(_error_reply(None, error_type, protocol.short_repr(message)))


_OPS = {
  "health": EnvServer._op_health,
  "stats": EnvServer._op_stats,
  "acquire": EnvServer._op_acquire,
  "release": EnvServer._op_release,
  "reset": EnvServer._op_reset,
  "step": EnvServer._op_step,
  "compute_reward": EnvServer._op_compute_reward,
}
