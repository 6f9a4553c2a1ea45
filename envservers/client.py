"""A trio client connection to one env server: many concurrent calls multiplexed by request id.

    conn = await Connection.open("127.0.0.1", 8765)
    await conn.call("acquire", {"env": "echo", "chain_id": "c0"})
    result = await conn.call("step", {"env": "echo", "chain_id": "c0", "action": "hi"})

The reply reader runs as a trio system task of the current run, so a Connection needs no nursery
and dies with its run (its pending calls then fail with ConnectionLost).
"""
from __future__ import annotations

import itertools
from typing import Any

import trio

from envservers import protocol


class ConnectionLost(ConnectionError):
  """The server closed the connection or could not be reached."""


class Connection:
  def __init__(self, stream: trio.SocketStream, address: str,
               max_frame_bytes: int = protocol.DEFAULT_MAX_FRAME_BYTES):
    self.address = address
    self.max_frame_bytes = max_frame_bytes
    self._stream = stream
    self._writer = protocol.FrameWriter(stream)
    self._ids = itertools.count(1)
    self._pending: dict[int, list] = {}   # id -> [event, reply]
    self.closed = False
    self.close_reason = ""
    self.token = trio.lowlevel.current_trio_token()
    trio.lowlevel.spawn_system_task(self._read_replies, name=f"envservers reader {address}")
    trio.lowlevel.spawn_system_task(self._write_requests, name=f"envservers writer {address}")

  @classmethod
  async def open(cls, address: str, connect_timeout_s: float = 5.0, **kwargs) -> "Connection":
    host, port = protocol.parse_address(address)
    try:
      with trio.fail_after(connect_timeout_s):
        stream = await trio.open_tcp_stream(host, port)
    except (OSError, trio.TooSlowError) as e:
      reason = str(e) or type(e).__name__
      raise ConnectionLost(f"cannot connect to env server {address}: {reason}") from None
    return cls(stream, address, **kwargs)

  async def _read_replies(self) -> None:
    reader = protocol.FrameReader(self._stream, self.max_frame_bytes)
    reason = "the server closed the connection"
    try:
      while True:
        body = await reader.read_body()
        if body is None:
          break
        reply = protocol.decode_body(body)
        reply_id = reply.get("id")
        slot = self._pending.pop(reply_id, None) if isinstance(reply_id, int) else None
        if slot is not None:
          slot[1] = reply
          slot[0].set()
        elif not reply.get("ok", True) and reply.get("id") is None:
          reason = f"server error: {reply.get('error')}"
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
      self._stream.socket.close()
    except OSError:
      pass
    for slot in self._pending.values():
      slot[0].set()
    self._pending.clear()

  async def call(self, op: str, args: dict[str, Any] | None = None,
                 timeout_s: float | None = None) -> dict[str, Any]:
    """Sends one request and waits for its reply's result.

    Raises RemoteError (an error reply), ConnectionLost, trio.TooSlowError after timeout_s,
    TypeError/ValueError (args not JSON) or ProtocolError (request over the frame limit).
    """
    if self.closed:
      raise ConnectionLost(f"env server {self.address}: {self.close_reason}")
    request_id = next(self._ids)
    frame = protocol.encode_frame({"id": request_id, "op": op, "args": args or {}},
                                  self.max_frame_bytes)
    slot = [trio.Event(), None]
    self._pending[request_id] = slot
    try:
      self._writer.put(frame)   # queued; the writer task sends frames whole and in order
      if timeout_s is None:
        await slot[0].wait()
      else:
        with trio.fail_after(timeout_s):
          await slot[0].wait()
    finally:
      self._pending.pop(request_id, None)
    reply = slot[1]
    if reply is None:
      raise ConnectionLost(f"env server {self.address}: {self.close_reason}")
    if not reply.get("ok"):
      error = reply.get("error") or {}
      raise protocol.RemoteError(str(error.get("type", "Unknown")), str(error.get("message", "")))
    return reply.get("result") or {}

  async def aclose(self) -> None:
    if not self.closed:
      self._fail_all("closed by the client")
      await trio.lowlevel.checkpoint()
