"""A trio client connection to one env server: many concurrent calls multiplexed by request id.

    conn = await Connection.open("127.0.0.1", 8765)
    await conn.call("acquire", {"env": "echo", "chain_id": "c0"})
    result = await conn.call("step", {"env": "echo", "chain_id": "c0", "action": "hi"})

The reply reader runs as a trio system task of the current run, so a Connection needs no nursery
and dies with its run (its pending calls then fail with ConnectionLost).

Authentication and TLS (auth.py): the token is $AGENTFLY_ENV_TOKEN(_FILE) unless `token=` is
given; with one, `open` runs the HMAC handshake and also checks the server's proof. TLS when
`ssl_context=` is given or $AGENTFLY_ENV_TLS_CA names a CA file. Whatever a server sends, a call
gets either its result (a dict) or an exception: a reply that breaks the protocol fails that call
with BadReply and closes the connection (the next `open` starts afresh).
"""

from __future__ import annotations

import itertools
from typing import Any

import trio

from envservers import auth, protocol

FROM_ENV = "from-env"  # token / ssl_context default: read the environment (auth.py)


class ConnectionLost(ConnectionError):
  """The server closed the connection or could not be reached."""


class BadReply(ConnectionLost):
  """The server sent something that breaks the protocol; the connection has been closed."""


class ServerHung(ConnectionLost):
  """The connection was closed because the server left a call unanswered past its limit; every
  call that was still waiting on it gets this (it waited on the same hung server)."""


class AuthenticationFailed(ConnectionLost):
  """The handshake failed: wrong or missing token on either side, or a server without one."""


def check_reply(reply: dict) -> str | None:
  """None if `reply` has the shape of a reply (PROTOCOL.md), else what is wrong with it."""
  ok = reply.get("ok")
  if not isinstance(ok, bool):
    return f"field 'ok' must be a bool, got {type(ok).__name__}"
  if ok and not isinstance(reply.get("result", {}), dict):
    return f"field 'result' must be an object, got {type(reply.get('result')).__name__}"
  if not ok:
    error = reply.get("error")
    if (
      not isinstance(error, dict)
      or not isinstance(error.get("type"), str)
      or not isinstance(error.get("message", ""), str)
    ):
      return "field 'error' must be an object with string 'type' and 'message'"
  return None


def _socket_of(stream):
  while not hasattr(stream, "socket"):  # trio.SSLStream wraps the SocketStream
    stream = stream.transport_stream
  return stream.socket


class Connection:
  def __init__(
    self,
    stream: trio.abc.Stream,
    address: str,
    max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES,
    reader: protocol.FrameReader | None = None,
  ):
    self.address = address
    self.max_frame_bytes = max_frame_bytes
    self._stream = stream
    self._reader = reader or protocol.FrameReader(stream, max_frame_bytes)
    self.bad_replies = 0
    self._writer = protocol.FrameWriter(stream)
    self._ids = itertools.count(1)
    self._pending: dict[int, list] = {}  # id -> [event, reply]
    self._abandoned: dict[int, Any] = {}  # id -> on_abandoned(reply) of a call given up on
    self.closed = False
    self.close_reason = ""
    self.hung = False  # closed because the server left a call unanswered (aclose)
    self.token = trio.lowlevel.current_trio_token()
    trio.lowlevel.spawn_system_task(self._read_replies, name=f"envservers reader {address}")
    trio.lowlevel.spawn_system_task(self._write_requests, name=f"envservers writer {address}")

  @classmethod
  async def open(
    cls,
    address: str,
    connect_timeout_s: float = 5.0,
    *,
    token=FROM_ENV,
    ssl_context=FROM_ENV,
    max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES,
  ) -> "Connection":
    """Connects (TLS if configured) and authenticates (if a token is configured) within
    `connect_timeout_s`. Raises ConnectionLost, or AuthenticationFailed (a subclass)."""
    host, port = protocol.parse_address(address)
    token = auth.load_token() if token == FROM_ENV else token
    ssl_context = auth.default_client_ssl_context() if ssl_context == FROM_ENV else ssl_context
    stream = None
    try:
      with trio.fail_after(connect_timeout_s):
        stream = await trio.open_tcp_stream(host, port)
        if ssl_context is not None:
          stream = trio.SSLStream(stream, ssl_context, server_hostname=host)
          await stream.do_handshake()
        reader = protocol.FrameReader(stream, max_frame_bytes)
        await _handshake(stream, reader, token, address)
    except AuthenticationFailed:
      await trio.aclose_forcefully(stream)
      raise
    except (OSError, trio.TooSlowError, trio.BrokenResourceError, protocol.ProtocolError) as e:
      if stream is not None:
        await trio.aclose_forcefully(stream)
      reason = str(e) or type(e).__name__
      if e.__cause__ is not None:  # e.g. the ssl error behind a BrokenResourceError
        reason = f"{reason}: {e.__cause__}"
      raise ConnectionLost(f"cannot connect to env server {address}: {reason}") from None
    except BaseException:
      if stream is not None:
        await trio.aclose_forcefully(stream)
      raise
    return cls(stream, address, max_frame_bytes, reader)

  async def _read_replies(self) -> None:
    reason = "the server closed the connection"
    try:
      while True:
        body = await self._reader.read_body()
        if body is None:
          break
        reply = protocol.decode_body(body)
        reply_id = reply.get("id")
        slot = self._pending.pop(reply_id, None) if type(reply_id) is int else None
        problem = check_reply(reply) if slot is not None or reply_id is None else None
        if problem is not None and "hello" not in reply:
          self.bad_replies += 1
          reason = f"bad reply from the server: {problem}"
          if slot is not None:
            slot[0].set()  # no reply stored: the call raises BadReply
          break
        if slot is not None:
          slot[1] = reply
          slot[0].set()
        elif reply_id in self._abandoned and type(reply_id) is int:
          try:
            self._abandoned.pop(reply_id)(reply)
          except Exception:  # noqa: BLE001 -- a callback must not kill the reader
            pass
        elif reply_id is None and reply.get("ok") is False:
          reason = f"server error: {protocol.short_repr(reply.get('error'), 500)}"
    except trio.Cancelled:
      reason = "the trio run that opened the connection ended"
      raise
    except Exception as e:  # a system task must never raise: it would crash the run
      reason = f"connection failed: {type(e).__name__}: {e}"
    finally:
      self._fail_all(reason)

  async def _write_requests(self) -> None:
    try:
      await self._writer.run()
    except trio.Cancelled:
      raise
    except Exception as e:  # a system task must never raise
      self._fail_all(f"send failed: {type(e).__name__}: {e}")

  def _fail_all(self, reason: str) -> None:
    if self.closed:
      return
    self.closed = True
    self._writer.close()
    self.close_reason = reason
    try:
      _socket_of(self._stream).close()
    except OSError:
      pass
    for slot in self._pending.values():
      slot[0].set()
    self._pending.clear()

  async def call(
    self, op: str, args: dict[str, Any] | None = None, timeout_s: float | None = None, on_abandoned=None
  ) -> dict[str, Any]:
    """Sends one request and waits for its reply's result.

    Raises RemoteError (an error reply), ConnectionLost, trio.TooSlowError after timeout_s,
    TypeError/ValueError (args not JSON) or ProtocolError (request over the frame limit).
    `on_abandoned(reply)`: if the call is cancelled or times out after it was sent, the reply
    that still arrives is passed to it (in the reader task: it must be quick and not raise), e.g.
    to release an instance an abandoned `acquire` got anyway.
    """
    if self.closed:
      raise ConnectionLost(f"env server {self.address}: {self.close_reason}")
    request_id = next(self._ids)
    frame = protocol.encode_frame({"id": request_id, "op": op, "args": args or {}}, self.max_frame_bytes)
    slot = [trio.Event(), None]
    self._pending[request_id] = slot
    try:
      self._writer.put(frame)  # queued; the writer task sends frames whole and in order
      if timeout_s is None:
        await slot[0].wait()
      else:
        with trio.fail_after(timeout_s):
          await slot[0].wait()
    except BaseException:
      if on_abandoned is not None and slot[1] is None and not self.closed:
        self._abandoned[request_id] = on_abandoned
      raise
    finally:
      self._pending.pop(request_id, None)
    reply = slot[1]
    if reply is None:
      kind = BadReply if self.close_reason.startswith("bad reply") else ServerHung if self.hung else ConnectionLost
      raise kind(f"env server {self.address}: {self.close_reason}")
    if not reply.get("ok"):
      error = reply.get("error") or {}
      raise protocol.RemoteError(str(error.get("type", "Unknown")), str(error.get("message", "")))
    return reply.get("result") or {}

  async def aclose(self, hung_after_s: float | None = None) -> None:
    """Closes the connection; calls still waiting raise ConnectionLost, or ServerHung when
    `hung_after_s` says a call got no reply within that many seconds (the reason it closes)."""
    if not self.closed:
      self.hung = hung_after_s is not None
      self._fail_all(
        "closed by the client"
        if hung_after_s is None
        else f"closed by the client: the server left a call unanswered for {hung_after_s:g} s"
      )
      await trio.lowlevel.checkpoint()


async def _handshake(stream, reader: protocol.FrameReader, token: bytes | None, address: str) -> None:
  """Reads the server's hello and, if either side has a token, runs the HMAC handshake
  (auth.py); raises AuthenticationFailed (ProtocolError if the hello is not a frame)."""
  body = await reader.read_body()
  if body is None:
    raise ConnectionLost(f"env server {address} closed the connection before its hello")
  hello = protocol.decode_body(body).get("hello")
  if not isinstance(hello, dict):
    raise AuthenticationFailed(f"{address} did not greet like an env server (no hello frame)")
  if hello.get("auth") is None and token is None:
    return
  if hello.get("auth") is None:
    raise AuthenticationFailed(
      f"env server {address} does not ask for authentication although a "
      f"token is configured (a server started without one?); refusing "
      f"to send it work"
    )
  if token is None:
    raise AuthenticationFailed(
      f"env server {address} needs authentication: set ${auth.TOKEN_ENV} (or ${auth.TOKEN_FILE_ENV}) to its token"
    )
  if hello.get("auth") != auth.SCHEME or not isinstance(hello.get("nonce"), str):
    raise AuthenticationFailed(
      f"env server {address} asks for authentication scheme "
      f"{protocol.short_repr(hello.get('auth'))}; this client speaks "
      f"{auth.SCHEME}"
    )
  client_nonce = auth.new_nonce()
  await stream.send_all(
    protocol.encode_frame(
      {
        "id": 0,
        "op": "auth",
        "args": {"client_nonce": client_nonce, "mac": auth.client_mac(token, hello["nonce"], client_nonce)},
      }
    )
  )
  body = await reader.read_body()
  reply = protocol.decode_body(body) if body is not None else {}
  if reply.get("ok") is not True:
    error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    raise AuthenticationFailed(
      f"env server {address} refused the token: {error.get('type', 'closed')}: {error.get('message', '')}"
    )
  result = reply.get("result") if isinstance(reply.get("result"), dict) else {}
  if not auth.macs_equal(auth.server_mac(token, hello["nonce"], client_nonce), result.get("server_mac")):
    raise AuthenticationFailed(f"env server {address} could not prove it holds the token")
