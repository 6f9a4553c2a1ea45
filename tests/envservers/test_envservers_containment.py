"""Containment: decoding limits without recursion; a bug while handling one request or one
connection never takes the server down; whatever a server replies, the client and the manager
fail only that call (an error observation for `step`), drop the connection and reconnect."""

from __future__ import annotations

import json
import struct

import pytest
import trio

import envservers.envs  # noqa: F401  (registers the built-in env types)
from agentfly_jax.envs import EnvManager, EnvUnavailable
from envservers import protocol
from envservers.client import BadReply, Connection
from envservers.server import EnvServer

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
  "body, needle",
  [
    (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deeper than the limit of 64"),
    (b'{"a":' + b"{\"k\":" * 65 + b"1" + b"}" * 65 + b"}", "deeper than the limit of 64"),
    (b'{"a":"\\ud800"}', "lone surrogate"),
    (b'{"a":' + b"1" * 5000 + b"}", "not UTF-8 JSON"),
    (b'{"a":"' + b"x" * (protocol.DEFAULT_LIMITS.max_string_chars + 1) + b'"}', "a string of"),
    (b'{"a":[' + b"0," * protocol.DEFAULT_LIMITS.max_items + b"0]}", "an array of 100001 items"),
  ],
)
def test_decode_limits_are_bad_frames(body, needle):
  with pytest.raises(protocol.ProtocolError, match=needle) as info:
    protocol.decode_body(body)
  assert info.value.error_type == protocol.BAD_FRAME


def test_depth_check_agrees_with_a_reference_on_random_documents():
  """The byte-level depth check against the nesting of the parsed value, with escapes and
  brackets inside strings, around the limit."""
  import random

  rng = random.Random(7)

  def build(depth):
    if depth == 0 or rng.random() < 0.15:
      return rng.choice([1, None, '"[{\\', "]}", "\\\\\"["])
    if rng.random() < 0.5:
      return [build(depth - 1) for _ in range(rng.randrange(1, 3))]
    return {f'k{i}"[': build(depth - 1) for i in range(rng.randrange(1, 3))}

  def nesting(value):
    deepest, stack = 0, [(value, 1)]
    while stack:
      item, level = stack.pop()
      if isinstance(item, (list, dict)):
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest

  limits = protocol.DecodeLimits(max_depth=12)
  for _ in range(2000):
    document = {"x": build(rng.randrange(20))}
    body = json.dumps(document).encode()
    try:
      protocol.decode_body(body, limits)
      accepted = True
    except protocol.ProtocolError:
      accepted = False
    assert accepted == (nesting(document) <= 12), body


async def _in_process_server(nursery, **kwargs) -> tuple[EnvServer, str]:
  server = EnvServer({"echo": (4, 1)}, **kwargs)
  port = await nursery.start(lambda task_status: server.serve("127.0.0.1", 0, task_status=task_status))
  return server, f"127.0.0.1:{port}"


@pytest.mark.trio
async def test_bugs_in_a_request_or_a_connection_are_contained(monkeypatch):
  async with trio.open_nursery() as nursery:
    server, address = await _in_process_server(nursery)
    conn = await Connection.open(address, token=None)

    async def broken_reply(self, conn, request):
      raise RecursionError("a bug in the server")

    monkeypatch.setattr(EnvServer, "_reply_to", broken_reply)
    with pytest.raises(protocol.RemoteError, match="InternalError: RecursionError"):
      await conn.call("health")
    monkeypatch.undo()
    assert (await conn.call("health"))["status"] == "ok"

    original = EnvServer._serve_connection

    async def broken_connection(self, c):
      raise KeyError("a bug in the connection handler")

    monkeypatch.setattr(EnvServer, "_serve_connection", broken_connection)
    victim = await trio.open_tcp_stream("127.0.0.1", int(address.rsplit(":", 1)[1]))
    assert await victim.receive_some(10) == b""  # closed; the server lives on
    monkeypatch.setattr(EnvServer, "_serve_connection", original)
    stats = await conn.call("stats")
    assert stats["internal_errors"] == 1 and stats["connection_errors"] == 1
    assert stats["status"] == "ok"
    await conn.aclose()
    server.shutdown()


class HostileServer:
  """Greets like an env server and answers `acquire` properly (with a 0.5 s env limit); a
  `step` (or `reset`) gets `self.next` (a misbehaviour, then "good" again)."""

  def __init__(self):
    self.next = "good"
    self.connections = 0

  async def handle(self, stream):
    self.connections += 1
    reader = protocol.FrameReader(stream)
    await stream.send_all(protocol.encode_frame({"hello": {"protocol": 1, "auth": None}}))
    try:
      while (body := await reader.read_body()) is not None:
        request = protocol.decode_body(body)
        rid, op = request["id"], request["op"]
        if op == "acquire":
          await stream.send_all(
            protocol.encode_frame({"id": rid, "ok": True, "result": {"instance_id": 1, "call_timeout_s": 0.5}})
          )
          continue
        if op == "release":
          await stream.send_all(protocol.encode_frame({"id": rid, "ok": True, "result": {}}))
          continue
        behaviour, self.next = self.next, "good"
        good = {"id": rid, "ok": True, "result": {"observation": "fine", "reward": None, "done": False, "info": {}}}
        if behaviour == "good":
          await stream.send_all(protocol.encode_frame(good))
        elif behaviour == "garbage":
          await stream.send_all(struct.pack(">I", 7) + b"\xff{oops}")
        elif behaviour == "deep":
          body = b'{"id":' + str(rid).encode() + b',"ok":true,"result":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
          await stream.send_all(struct.pack(">I", len(body)) + body)
        elif behaviour == "ok_not_bool":
          await stream.send_all(protocol.encode_frame({**good, "ok": "yes"}))
        elif behaviour == "result_list":
          await stream.send_all(protocol.encode_frame({**good, "result": [1, 2]}))
        elif behaviour == "observation_int":
          await stream.send_all(protocol.encode_frame({**good, "result": {**good["result"], "observation": 5}}))
        elif behaviour == "error_not_object":
          await stream.send_all(protocol.encode_frame({"id": rid, "ok": False, "error": "no"}))
        elif behaviour == "oversized_header":
          await stream.send_all(struct.pack(">I", 2**32 - 1))
        elif behaviour == "hang":
          await trio.sleep_forever()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
      pass


BEHAVIOURS = [
  "garbage",
  "deep",
  "ok_not_bool",
  "result_list",
  "observation_int",
  "error_not_object",
  "oversized_header",
  "hang",
]


@pytest.mark.trio
async def test_manager_survives_any_reply():
  hostile = HostileServer()
  async with trio.open_nursery() as nursery:
    listeners = await nursery.start(trio.serve_tcp, hostile.handle, 0)
    address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    manager = EnvManager([address], token=None, reply_grace_s=0.5, down_retry_s=0.01)
    env = await manager.acquire("any", "c0")
    for behaviour in BEHAVIOURS:
      hostile.next = behaviour
      with trio.fail_after(20):
        result = await env.step("x")
      # The misbehaving call is an error observation, never an exception ...
      expected = "Timeout" if behaviour == "hang" else "ConnectionLost"
      assert "Error" in result.observation and result.info["error"] == expected, (behaviour, result)
      # ... and the next call runs on a fresh connection.
      again = await env.step("y")
      assert again.observation.endswith("fine") and "state is gone" in again.observation, (behaviour, again)
    assert hostile.connections == len(BEHAVIOURS) + 1
    metrics = manager.metrics()
    assert metrics["envs/timeouts"] == 1 and metrics["envs/reconnects"] == len(BEHAVIOURS)
    # reset / compute_reward raise EnvUnavailable (not a KeyError or TypeError) on a bad reply.
    hostile.next = "observation_int"
    with pytest.raises(EnvUnavailable, match="bad 'reset' result"):
      await env.reset({})
    await manager.aclose()
    nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_every_call_waiting_on_a_hung_server_is_a_timeout():
  """Two chains share one connection to a server that stops answering: the first call's timeout
  closes the connection, and the second call (still inside its own limit) is reported as the
  same timeout, never as a lost connection (the race behind a flaky chaos test)."""
  hostile = HostileServer()
  async with trio.open_nursery() as nursery:
    listeners = await nursery.start(trio.serve_tcp, hostile.handle, 0)
    address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    manager = EnvManager([address], token=None, reply_grace_s=0.5, down_retry_s=60)
    first, second = await manager.acquire("any", "c0"), await manager.acquire("any", "c1")
    results = {}

    async def step(env, delay):
      await trio.sleep(delay)
      hostile.next = "hang"
      results[env.chain_id] = await env.step("x")

    with trio.fail_after(20):
      async with trio.open_nursery() as steps:
        steps.start_soon(step, first, 0)
        steps.start_soon(step, second, 0.4)
    assert {r.info["error"] for r in results.values()} == {"Timeout"}, results
    assert all(r.observation.startswith("Error (Timeout)") for r in results.values())
    assert manager.metrics()["envs/timeouts"] == 2
    assert manager.metrics()["envs/connection_errors"] == 0
    await manager.aclose()
    nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_client_bad_reply_fails_the_call_and_closes():
  hostile = HostileServer()
  async with trio.open_nursery() as nursery:
    listeners = await nursery.start(trio.serve_tcp, hostile.handle, 0)
    address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    conn = await Connection.open(address, token=None)
    await conn.call("acquire", {})
    hostile.next = "ok_not_bool"
    with pytest.raises(BadReply, match="field 'ok' must be a bool"):
      await conn.call("step", {})
    assert conn.closed and conn.bad_replies == 1
    nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_cancelled_acquire_never_leaks_an_instance():
  """An acquire cancelled while the server waits for a free instance: when one frees up, the
  server binds it to the abandoned chain, and the manager releases it again."""
  async with trio.open_nursery() as nursery:
    server = EnvServer({"counter": (1, 1)})
    port = await nursery.start(lambda task_status: server.serve("127.0.0.1", 0, task_status=task_status))
    manager = EnvManager([f"127.0.0.1:{port}"], token=None, acquire_wait_s=5)
    await manager.acquire("counter", "holder")
    with trio.move_on_after(0.3) as scope:
      await manager.acquire("counter", "impatient")  # waits on the server: the pool is full
    assert scope.cancelled_caught
    await manager.release("counter", "holder")  # the waiting acquire now gets the instance
    pool = server.pools["counter"]
    with trio.fail_after(10):
      while pool.counters["releases"] < 2 or pool.bound:
        await trio.sleep(0.02)
    assert pool.counters["acquires"] == 2 and not pool.bound
    assert manager.metrics()["envs/allocated"] == 0
    await manager.aclose()
    server.shutdown()
