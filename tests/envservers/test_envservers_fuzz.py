"""A property-based fuzzer of the env-server protocol against a real server on loopback.

Hypothesis builds batches of frames over the protocol's grammar: valid requests with hostile
values (huge ids, unknown ops/envs, wrong types in every field, odd strings), and bad bodies
(invalid JSON, non-objects, lone surrogates, invalid UTF-8, nesting past the limit, over-long
integers), each batch ending cleanly, with a length header over the limit, with a truncated frame,
or with an abrupt disconnect (RST). Each batch runs on one connection (many frames per
connection); >= 10,000 frames per run. Every frame must get exactly the replies the protocol
promises, the server must keep serving (a normal chain works afterwards), and its counters must
account for every bad frame.
"""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from envservers import protocol
from envservers_helpers import running_server

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]
MIN_FRAMES = 10_000
LIMITS = protocol.DEFAULT_LIMITS
OPS = ["health", "stats", "acquire", "release", "reset", "step", "compute_reward"]
ARG_NAMES = ["env", "chain_id", "action", "row", "name", "kwargs", "wait_s", "timeout_s"]


# -- frame strategies -----------------------------------------------------------------------------

hostile_text = st.one_of(
  st.text(max_size=12),
  st.sampled_from(["", "\x00", "\\", '"', "\u2028", "é" * 50, "😀", "a" * 2000, "echo ", "ECHO", "../../etc/passwd"]),
)
json_leaf = st.one_of(
  st.none(),
  st.booleans(),
  st.integers(-(2**70), 2**70),
  st.integers(-(10**300), 10**300),
  st.floats(allow_nan=False),
  hostile_text,
)
json_value = st.recursive(
  json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3), max_leaves=4
)
arg_value = {
  "env": st.sampled_from(["echo", "counter"]) | json_value,
  "chain_id": st.sampled_from(["c0", "c1", "c2", 7]) | json_value,
  "wait_s": st.sampled_from([0, 0.01, 600, 601, -1]) | json_value,
  "timeout_s": st.sampled_from([None, 1e-9, 3600, 0]) | json_value,
  "row": st.none() | st.fixed_dictionaries({"max_steps": st.integers(-2, 5)}) | json_value,
  "name": st.sampled_from(["length", "steps", "nope"]) | json_value,
  "kwargs": st.fixed_dictionaries({"text": hostile_text}) | json_value,
  "action": json_value,
}
request_args = st.fixed_dictionaries({}, optional={**arg_value, "zzz": json_value})
request_ids = st.one_of(
  st.integers(0, 2**31),
  st.integers(2**64, 2**200).map(lambda n: -n),
  st.text(max_size=10),
  st.none(),
  st.booleans(),
  st.floats(allow_nan=False),
  st.lists(st.integers(), max_size=2),
)


@st.composite
def request_frame(draw):
  """A well-formed JSON object (the server must answer it with exactly one reply)."""
  message = {
    "id": draw(request_ids),
    "op": draw(st.sampled_from(OPS) | st.sampled_from(["", "Health", "auth"]) | json_value),
  }
  if draw(st.integers(0, 9)):
    message["args"] = draw(request_args | json_value)
  if draw(st.integers(0, 9)) == 0:
    message["extra"] = draw(json_value)
  if draw(st.booleans()):  # deep but within the limit (object + args + 62 levels = 64)
    depth = draw(st.integers(1, LIMITS.max_depth - 2))
    if isinstance(message.get("args"), dict):
      message["args"]["action"] = json.loads("[" * depth + "]" * depth)
  text = json.dumps(message, ensure_ascii=draw(st.booleans()))
  return ("request", text.encode("utf-8"), message["id"])


@st.composite
def bad_frame(draw):
  """A body the server must reject with one BadFrame reply (id null)."""
  kind = draw(st.integers(0, 7))
  valid = json.dumps(
    {
      "id": draw(st.integers(0, 99)),
      "op": "step",
      "args": {"env": "echo", "chain_id": "c0", "action": draw(json_value)},
    }
  )
  if kind == 0:  # random bytes; a raw NUL is never valid JSON
    body = draw(st.binary(max_size=60)) + b"\x00" + draw(st.binary(max_size=10))
  elif kind == 1:  # a valid request cut short
    body = valid.encode()[: draw(st.integers(0, len(valid) - 1))]
  elif kind == 2:  # JSON that is not an object
    body = json.dumps(draw(st.lists(json_leaf, max_size=3) | json_leaf)).encode()
  elif kind == 3:  # an escaped lone surrogate
    surrogate = draw(st.integers(0xD800, 0xDFFF))
    body = valid[:-3].encode() + f',"x":"a\\u{surrogate:04x}b"}}}}'.encode()
  elif kind == 4:  # invalid UTF-8 inside a string (raw surrogate bytes, stray continuation)
    body = (
      b'{"id":1,"op":"health","args":{"s":"'
      + draw(st.sampled_from([b"\xed\xa0\x80", b"\x80", b"\xff", b"\xc3"]))
      + b'"}}'
    )
  elif kind == 5:  # nesting past the limit
    depth = draw(st.integers(LIMITS.max_depth - 1, 3000))
    body = b'{"id":1,"op":"step","args":{"env":"echo","chain_id":"c0","action":' + b"[" * depth + b"]" * depth + b"}}"
  elif kind == 6:  # an integer too long to convert
    body = b'{"id":' + b"9" * draw(st.integers(4301, 6000)) + b',"op":"health"}'
  else:  # a valid object followed by trailing garbage
    body = valid.encode() + draw(st.sampled_from([b"}", b",", b"x", b"{}", b" 1"]))
  return ("bad", body, None)


batch = st.tuples(
  st.lists(st.one_of(request_frame(), bad_frame()), min_size=10, max_size=14),
  st.sampled_from(["clean", "clean", "too_large", "truncated", "rst_mid_frame", "rst_in_flight"]),
)

DEEP = 100_000
DEEP_FRAME = (
  "bad",
  b'{"id":1,"op":"step","args":{"env":"echo","chain_id":"c0","action":' + b"[" * DEEP + b"]" * DEEP + b"}}",
  None,
)


# -- the client side ------------------------------------------------------------------------------


class _Sock:
  def __init__(self, address: str):
    host, port = protocol.parse_address(address)
    self.sock = socket.create_connection((host, port), timeout=60)
    self.buffer = b""
    hello = self.read()
    assert hello["hello"]["auth"] is None

  def send(self, frames: list[bytes]) -> None:
    self.sock.sendall(b"".join(frames))

  def read(self) -> dict | None:
    """The next frame (decoded with the stdlib, independently of the server's decoder)."""
    while True:
      if len(self.buffer) >= 4:
        (length,) = struct.unpack(">I", self.buffer[:4])
        if len(self.buffer) >= 4 + length:
          body, self.buffer = self.buffer[4 : 4 + length], self.buffer[4 + length :]
          return json.loads(body)
      chunk = self.sock.recv(1 << 20)
      if not chunk:
        assert not self.buffer, "stream ended inside a reply"
        return None
      self.buffer += chunk


def _reset(conn: _Sock) -> None:
  """Closes with an RST (SO_LINGER 0): an abrupt disconnect."""
  conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
  conn.sock.close()


def _frame(body: bytes) -> bytes:
  return struct.pack(">I", len(body)) + body


class _Tally:
  def __init__(self):
    self.frames = self.requests = self.bad = self.too_large = self.truncated = self.rst = 0


def _amplify(frames):
  """Each generated request is also sent again (same id: two replies), cut in half, and with a
  stray byte after it (both bad frames), so each generated frame yields ~2.5 frames on the wire."""
  out = []
  for kind, body, request_id in frames:
    out.append((kind, body, request_id))
    if kind == "request":
      out += [(kind, body, request_id), ("bad", body[: len(body) // 2], None), ("bad", body + b"}", None)]
  return out


def _run_batch(address: str, frames, ending: str, tally: _Tally) -> None:
  conn = _Sock(address)
  if ending == "rst_in_flight":  # requests only (their count may be cut short by the RST)
    frames = [f for f in frames if f[0] == "request"]
  conn.send([_frame(body) for _, body, _ in frames])
  n_requests = sum(kind == "request" for kind, _, _ in frames)
  n_bad = len(frames) - n_requests
  tally.frames += len(frames) + (ending in ("too_large", "truncated"))
  if ending == "rst_in_flight":  # RST at once, with requests running and replies unread
    tally.rst += 1
    _reset(conn)
    return
  tally.requests += n_requests
  tally.bad += n_bad
  if ending == "too_large":
    conn.send([struct.pack(">I", protocol.DEFAULT_MAX_FRAME_BYTES + 1)])
    tally.too_large += 1
  elif ending == "truncated":
    conn.send([struct.pack(">I", 50) + b'{"id": 3, "op"'])
    conn.sock.shutdown(socket.SHUT_WR)
    tally.truncated += 1
  replies = []
  expected = n_requests + n_bad + (ending in ("too_large", "truncated"))
  while len(replies) < expected:
    reply = conn.read()
    assert reply is not None, f"connection closed after {len(replies)} of {expected} replies"
    replies.append(reply)
  if ending in ("too_large", "truncated"):  # the server closes a connection whose framing is lost
    assert conn.read() is None
  if ending == "rst_mid_frame":  # every reply read, then half a frame and an RST
    conn.send([struct.pack(">I", 100) + b'{"id":'])
    tally.frames += 1
    tally.rst += 1
    _reset(conn)
  conn.sock.close()
  # Exactly the promised replies: one per request (by id where the id is unique), one BadFrame
  # (id null) per bad body, one FrameTooLarge / BadFrame for the ending; nothing internal.
  assert all(isinstance(r.get("ok"), bool) for r in replies), replies
  types = [r["error"]["type"] for r in replies if not r["ok"]]
  assert "InternalError" not in types, replies
  frame_errors = [
    r for r in replies if not r["ok"] and r["id"] is None and r["error"]["type"] in ("BadFrame", "FrameTooLarge")
  ]
  assert len(frame_errors) == expected - n_requests, (frames, replies)
  if ending == "too_large":
    assert sum(r["error"]["type"] == "FrameTooLarge" for r in frame_errors) == 1
  ids = [request_id for kind, _, request_id in frames if kind == "request" and type(request_id) in (int, str)]
  for request_id in set(ids):
    got = sum(r.get("id") == request_id and type(r.get("id")) is type(request_id) for r in replies)
    assert got == ids.count(request_id), (request_id, replies)


# -- the test -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
  with running_server("echo=512:1", "counter=512:1") as s:
    yield s


def _stats(address: str) -> dict:
  conn = _Sock(address)
  conn.send([protocol.encode_frame({"id": "stats", "op": "stats"})])
  reply = conn.read()
  conn.sock.close()
  return reply["result"]


def test_fuzz_frames_against_a_real_server(server):
  before = _stats(server.address)
  tally = _Tally()

  @settings(max_examples=360, deadline=None, database=None, suppress_health_check=list(HealthCheck))
  @given(batch)
  @example(([DEEP_FRAME, ("request", b'{"id": 1, "op": "health"}', 1)], "clean"))
  def fuzz(generated):
    frames, ending = generated
    _run_batch(server.address, _amplify(frames), ending, tally)

  for _ in range(3):  # hypothesis draws batch sizes at random: another pass until MIN_FRAMES were sent
    fuzz()
    if tally.frames >= MIN_FRAMES:
      break
  # Explicit frames at the limits (too big for the generators to find by chance).
  big = [
    ("bad", b'{"id":1,"op":"step","args":{"action":"' + b"x" * (LIMITS.max_string_chars + 1) + b'"}}', None),
    ("bad", b'{"id":1,"op":"step","args":{"action":[' + b"0," * LIMITS.max_items + b"0]}}", None),
    ("bad", b'{"id":1,"args":[' + b"[0,0,0,0,0,0,0,0,0]," * (LIMITS.max_values // 10) + b"0]}", None),
    (
      "request",
      b'{"id":"at-limit","op":"step","args":{"action":[' + b"0," * (LIMITS.max_items - 1) + b"0]}}",
      "at-limit",
    ),
  ]
  _run_batch(server.address, big, "clean", tally)
  assert tally.frames >= MIN_FRAMES, tally.frames

  # The server still serves a normal chain ...
  conn = _Sock(server.address)
  chain = {"env": "counter", "chain_id": "after-fuzz"}
  replies = []
  for i, (op, args) in enumerate(
    [
      ("acquire", chain),
      ("reset", {**chain, "row": {"max_steps": 2}}),
      ("step", {**chain, "action": None}),
      ("step", {**chain, "action": None}),
      ("release", chain),
    ]
  ):
    conn.send([protocol.encode_frame({"id": i, "op": op, "args": args})])
    replies.append(conn.read())
  conn.sock.close()
  assert all(r["ok"] for r in replies), replies
  assert replies[3]["result"] == {"observation": "count=2", "reward": 1.0, "done": True, "info": {}}

  # ... and its counters account for every bad frame (once it has seen every close).
  deadline = time.monotonic() + 30
  while (after := _stats(server.address))["open_connections"] > 1 and time.monotonic() < deadline:
    time.sleep(0.1)
  delta = {
    k: after[k] - before[k]
    for k in ("bad_frames", "frames_too_large", "truncated_frames", "requests", "connection_errors", "internal_errors")
  }
  assert delta["bad_frames"] == tally.bad, (delta, vars(tally))
  assert delta["frames_too_large"] == tally.too_large
  # A half frame before an RST may be dropped by the kernel: those count at most once.
  assert tally.truncated <= delta["truncated_frames"] <= tally.truncated + tally.rst
  assert delta["requests"] >= tally.requests + 1  # + the stats call above; RST'd ones may add
  assert delta["connection_errors"] == 0 and delta["internal_errors"] == 0
  assert after["status"] == "ok" and after["open_connections"] == 1
