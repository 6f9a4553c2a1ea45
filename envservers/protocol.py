"""The envservers wire protocol: length-prefixed JSON frames, multiplexed by request id.

A frame is a 4-byte big-endian unsigned length N followed by N bytes of UTF-8 JSON encoding one
object. Requests are `{"id": int|str, "op": str, "args": {...}}`; replies carry the same id and
are either `{"id": ..., "ok": true, "result": {...}}` or
`{"id": ..., "ok": false, "error": {"type": str, "message": str}}`. Replies may arrive in any
order. See PROTOCOL.md for the operations. This module is transport-agnostic and stdlib-only
(plus trio for the async stream helpers), so the trainer-side client shares it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from typing import Any

import trio

HEADER = struct.Struct(">I")
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
try:  # optional accelerator for decoding (~6x faster; same results for valid JSON)
  import msgspec

  _FAST_DECODER = msgspec.json.Decoder()
except ImportError:  # pragma: no cover - depends on the environment
  msgspec = None
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class DecodeLimits:
  """What one frame body may contain (besides `max_frame_bytes` on its length); see PROTOCOL.md.

  max_depth: nesting of arrays/objects (`{"a": [1]}` has depth 2).
  max_string_chars: characters in one string (keys included).
  max_items: elements of one array or members of one object.
  max_values: JSON values in the whole body (every scalar, array and object counts one).
  """

  max_depth: int = 64
  max_string_chars: int = 8 * 1024 * 1024
  max_items: int = 100_000
  max_values: int = 1_000_000


DEFAULT_LIMITS = DecodeLimits()

# Error types a server can reply with (the `error.type` field).
BAD_FRAME = "BadFrame"  # frame body is not a JSON object / not UTF-8 / over a limit
FRAME_TOO_LARGE = "FrameTooLarge"  # length header above the server's limit (connection closed)
BAD_REQUEST = "BadRequest"  # missing/wrong-typed field: message names the field
UNKNOWN_OP = "UnknownOp"
UNKNOWN_ENV = "UnknownEnv"
NOT_ACQUIRED = "NotAcquired"  # call for a chain that holds no instance of that env
POOL_EXHAUSTED = "PoolExhausted"  # every instance up to the cap is in use; retry later
ENV_ERROR = "EnvError"  # the env raised (message has the exception)
BAD_OBSERVATION = "BadObservation"  # the env returned an observation outside the part shape / image limits
SHUTTING_DOWN = "ShuttingDown"
INTERNAL = "InternalError"
AUTH_REQUIRED = "AuthRequired"  # first frame of a connection to a token server was not `auth`
AUTH_FAILED = "AuthFailed"  # wrong HMAC (wrong token or replayed handshake)


class ProtocolError(Exception):
  """A frame that cannot be read: oversized length, truncated body, bad JSON."""

  def __init__(self, error_type: str, message: str):
    super().__init__(f"{error_type}: {message}")
    self.error_type = error_type
    self.message = message


class RemoteError(Exception):
  """An error reply from a server (`error.type`, `error.message`)."""

  def __init__(self, error_type: str, message: str):
    super().__init__(f"{error_type}: {message}")
    self.error_type = error_type
    self.message = message


def encode_frame(message: dict[str, Any], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
  """Returns header + JSON body for one message; raises ProtocolError if it is too large."""
  # Always the stdlib encoder: it defines what is sendable (msgspec would also take sets).
  body = _ENCODER.encode(message).encode("utf-8")
  if len(body) > max_frame_bytes:
    raise ProtocolError(FRAME_TOO_LARGE, f"message of {len(body)} bytes exceeds the limit of {max_frame_bytes}")
  return HEADER.pack(len(body)) + body


def decode_body(body: bytes, limits: DecodeLimits = DEFAULT_LIMITS) -> dict[str, Any]:
  """Parses one frame body; raises ProtocolError(BAD_FRAME) unless it is a JSON object within
  `limits`. Never raises anything else: the nesting depth is checked on the bytes before parsing
  (no RecursionError), and any other parser failure becomes BAD_FRAME."""
  try:
    _check_depth(body, limits.max_depth)
    fallback = False
    if msgspec is not None:
      try:
        message = _FAST_DECODER.decode(body)
      except msgspec.DecodeError:  # the stdlib also takes NaN / Infinity / integers > 64 bits
        fallback = True
    else:
      fallback = True
    if fallback:
      message = json.loads(body.decode("utf-8"))
      # Lone surrogates ("\ud800") parse to a str that cannot be sent back as UTF-8.
      _ENCODER.encode(message).encode("utf-8")
  except ProtocolError:
    raise
  except UnicodeEncodeError as e:
    raise ProtocolError(
      BAD_FRAME, f"frame body has a string that is not valid Unicode (a lone surrogate?): {short_text(e)}"
    ) from None
  except Exception as e:  # noqa: BLE001 -- whatever the parser raises, the frame is bad
    raise ProtocolError(BAD_FRAME, f"frame body is not UTF-8 JSON: {type(e).__name__}: {short_text(e)}") from None
  if not isinstance(message, dict):
    raise ProtocolError(BAD_FRAME, f"frame body must be a JSON object, got {type(message).__name__}")
  if len(body) > min(limits.max_string_chars, 2 * limits.max_items, limits.max_values):
    _check_sizes(message, limits)  # smaller bodies cannot exceed any of these limits
  return message


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_CURLY_AS_SQUARE = bytes.maketrans(b"{}", b"[]")


def _check_depth(body: bytes, max_depth: int) -> None:
  """Raises BAD_FRAME if arrays/objects nest deeper than `max_depth` (linear passes, no recursion).

  Escapes are dropped first (so no quote is escaped), then strings, then everything but brackets
  (all made square). Each pass then removes every adjacent "[]": that lowers the deepest point of
  balanced brackets by exactly one, so brackets that are not gone after `max_depth` passes nest
  deeper. Brackets that stop shrinking do not match: the parser rejects them.
  """
  if body.count(b"[") + body.count(b"{") <= max_depth:
    return
  brackets = _STRING.sub(b"", _ESCAPE.sub(b"", body)).translate(_CURLY_AS_SQUARE, _NOT_BRACKETS)
  too_deep = b"[" * (max_depth + 1)
  for _ in range(max_depth):
    if not brackets:
      return
    if too_deep in brackets:
      break
    reduced = brackets.replace(b"[]", b"")
    if len(reduced) == len(brackets):
      return
    brackets = reduced
  if brackets:
    raise ProtocolError(BAD_FRAME, f"JSON nests deeper than the limit of {max_depth} levels")


def _check_sizes(message: Any, limits: DecodeLimits) -> None:
  """Raises BAD_FRAME if a string, array or object, or the value count, is over `limits`."""
  stack, values = [message], 0
  while stack:
    value = stack.pop()
    values += 1
    if values > limits.max_values:
      raise ProtocolError(BAD_FRAME, f"frame has more than {limits.max_values} JSON values")
    if isinstance(value, str):
      if len(value) > limits.max_string_chars:
        raise ProtocolError(
          BAD_FRAME, f"a string of {len(value)} characters exceeds the limit of {limits.max_string_chars}"
        )
    elif isinstance(value, (list, dict)):
      if len(value) > limits.max_items:
        kind = "array" if isinstance(value, list) else "object"
        raise ProtocolError(BAD_FRAME, f"an {kind} of {len(value)} items exceeds the limit of {limits.max_items}")
      if isinstance(value, dict):
        stack.extend(value.keys())
        stack.extend(value.values())
      else:
        stack.extend(value)


def short_text(value: Any, limit: int = 120) -> str:
  """str(value) cut to `limit` characters (error messages never echo a whole hostile value)."""
  text = str(value)
  return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def short_repr(value: Any, limit: int = 80) -> str:
  """repr(value) cut to `limit` characters, for messages naming a client's bad value."""
  return short_text(repr(value), limit)


class FrameReader:
  """Reads frames from a trio stream (buffering partial reads)."""

  def __init__(self, stream: trio.abc.ReceiveStream, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
    self._stream = stream
    self._buffer = bytearray()
    self._start = 0  # consumed prefix of _buffer (compacted lazily, not per frame)
    self.max_frame_bytes = max_frame_bytes

  async def _fill(self, n: int) -> bool:
    while len(self._buffer) - self._start < n:
      if self._start:
        del self._buffer[: self._start]
        self._start = 0
      chunk = await self._stream.receive_some(max(65536, n - len(self._buffer)))
      if not chunk:
        return False
      self._buffer += chunk
    return True

  async def read_body(self) -> bytes | None:
    """Returns the next frame body, or None at a clean end of stream.

    Raises ProtocolError on an oversized length header or a stream that ends mid-frame.
    """
    if not await self._fill(HEADER.size):
      if len(self._buffer) > self._start:
        raise ProtocolError(BAD_FRAME, f"stream ended inside a frame header ({len(self._buffer) - self._start} bytes)")
      return None
    (length,) = HEADER.unpack_from(self._buffer, self._start)
    if length > self.max_frame_bytes:
      raise ProtocolError(FRAME_TOO_LARGE, f"frame length {length} exceeds the limit of {self.max_frame_bytes} bytes")
    if not await self._fill(HEADER.size + length):
      raise ProtocolError(BAD_FRAME, f"stream ended inside a frame body (expected {length} bytes)")
    begin = self._start + HEADER.size
    body = bytes(self._buffer[begin : begin + length])
    self._start = begin + length
    return body

  async def read_reply(self) -> bytes | None:
    """`read_body` for the replies of a child process: None at the end of the stream and also
    where the stream broke (the child died mid-frame, the pipe closed); the caller says why."""
    try:
      return await self.read_body()
    except (ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
      return None


class FrameWriter:
  """Coalesces outgoing frames: `put` never waits; `run` sends whatever is queued in one write.

  One task runs `run()` for the stream's lifetime; many tasks `put()` frames. Frames are sent
  whole and in order; the writer is the only task that touches the send side of the stream.
  """

  def __init__(self, stream: trio.abc.SendStream, on_sent=None):
    self._stream = stream
    self._queue: list[bytes] = []
    self._ready = trio.Event()
    self._on_sent = on_sent
    self.queued_bytes = 0
    self.closed = False

  def put(self, frame: bytes) -> None:
    if self.closed:
      raise trio.ClosedResourceError("frame writer is closed")
    self._queue.append(frame)
    self.queued_bytes += len(frame)
    self._ready.set()

  def close(self) -> None:
    self.closed = True
    self._ready.set()

  async def run(self) -> None:
    """Sends queued frames until `close()`; raises BrokenResourceError etc. if the peer goes."""
    while True:
      await self._ready.wait()
      self._ready = trio.Event()
      if self._queue:
        data = b"".join(self._queue)
        self._queue.clear()
        await self._stream.send_all(data)
        self.queued_bytes -= len(data)
        if self._on_sent is not None:
          self._on_sent()
      if self.closed and not self._queue:
        return


def parse_address(address: str) -> tuple[str, int]:
  """'host:port' -> (host, port); raises ValueError naming the bad address."""
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"env server address {address!r} is not host:port")
  return host.strip("[]"), int(port)
