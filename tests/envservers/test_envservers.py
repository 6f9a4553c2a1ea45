"""Env servers: protocol framing, server ops, pools (binding, reuse, caps), errors, shutdown.

Real servers run as subprocesses on loopback (tests/envservers_helpers.py).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest
import trio
import trio.testing

from envservers import protocol
from envservers.client import Connection, ConnectionLost
from envservers_helpers import connect, running_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
  with running_server(
    "echo=4:2",
    "counter=2:1",
    "sleep=4:1",
    "blocking_sleep=4:0",
    "worker_echo=3:1",
    options=('worker_echo.prefix="> "',),
  ) as s:
    yield s


# -- protocol -------------------------------------------------------------------------------------


def test_encode_decode_round_trip():
  message = {"id": 7, "op": "step", "args": {"action": "print('é')", "nested": [1, 2.5, None]}}
  frame = protocol.encode_frame(message)
  (length,) = struct.unpack(">I", frame[:4])
  assert length == len(frame) - 4
  assert protocol.decode_body(frame[4:]) == message


@pytest.mark.parametrize("body, needle", [(b"\xff\xfe", "UTF-8"), (b"[1, 2]", "object"), (b"{bad json", "JSON")])
def test_decode_body_rejects(body, needle):
  with pytest.raises(protocol.ProtocolError, match=needle) as info:
    protocol.decode_body(body)
  assert info.value.error_type == protocol.BAD_FRAME


def test_encode_rejects_oversized():
  with pytest.raises(protocol.ProtocolError) as info:
    protocol.encode_frame({"x": "a" * 100}, max_frame_bytes=50)
  assert info.value.error_type == protocol.FRAME_TOO_LARGE


@pytest.mark.parametrize("address", ["localhost", "host:", ":80", "h:0", "h:70000", "h:x"])
def test_parse_address_rejects(address):
  with pytest.raises(ValueError, match="host:port"):
    protocol.parse_address(address)


@pytest.mark.trio
async def test_frame_reader_reassembles_chunks_and_rejects_bad_lengths():
  send, receive = trio.testing.memory_stream_pair()
  messages = [{"id": i, "payload": "x" * (i * 37)} for i in range(20)]
  data = b"".join(protocol.encode_frame(m) for m in messages)
  reader = protocol.FrameReader(receive, max_frame_bytes=10_000)
  async with trio.open_nursery() as nursery:

    async def feed():
      for start in range(0, len(data), 13):  # 13-byte chunks split headers and bodies
        await send.send_all(data[start : start + 13])
      await send.send_all(struct.pack(">I", 10_001))

    nursery.start_soon(feed)
    for expected in messages:
      assert protocol.decode_body(await reader.read_body()) == expected
    with pytest.raises(protocol.ProtocolError) as info:
      await reader.read_body()
    assert info.value.error_type == protocol.FRAME_TOO_LARGE


# -- ops ------------------------------------------------------------------------------------------


@pytest.mark.trio
async def test_health_stats_and_echo(server):
  conn = await connect(server)
  health = await conn.call("health")
  assert health["status"] == "ok" and set(health["envs"]) == {
    "echo",
    "counter",
    "sleep",
    "blocking_sleep",
    "worker_echo",
  }
  assert health["envs"]["counter"]["rewards"] == ["steps"]
  await conn.call("acquire", {"env": "echo", "chain_id": "e1"})
  result = await conn.call("step", {"env": "echo", "chain_id": "e1", "action": {"b": [1], "a": 2}})
  assert result["observation"] == '{"a": 2, "b": [1]}'
  assert result["done"] is False and result["reward"] is None
  reward = await conn.call(
    "compute_reward", {"env": "echo", "chain_id": "e1", "name": "length", "kwargs": {"text": "abcd"}}
  )
  assert reward == {"reward": 4.0}
  stats = await conn.call("stats")
  assert stats["pools"]["echo"]["in_use"] >= 1 and stats["pools"]["echo"]["cap"] == 4
  assert stats["pools"]["echo"]["calls"] >= 2
  await conn.call("release", {"env": "echo", "chain_id": "e1"})
  await conn.aclose()


@pytest.mark.trio
async def test_counter_episode_reward_and_reset_on_release(server):
  conn = await connect(server)
  args = {"env": "counter", "chain_id": "c"}
  first = await conn.call("acquire", args)
  assert await conn.call("reset", {**args, "row": {"max_steps": 2}}) == {
    "observation": "count=0 max_steps=2",
    "restarted": False,
  }
  assert (await conn.call("step", {**args, "action": None}))["done"] is False
  last = await conn.call("step", {**args, "action": None})
  assert last == {"observation": "count=2", "reward": 1.0, "done": True, "info": {}}
  assert await conn.call("compute_reward", {**args, "name": "steps", "kwargs": {"scale": 0.5}}) == {
    "reward": 1.0,
    "count": 2,
  }
  # Same chain -> same instance; a second chain gets another one.
  assert (await conn.call("acquire", args))["instance_id"] == first["instance_id"]
  other = await conn.call("acquire", {"env": "counter", "chain_id": "d"})
  assert other["instance_id"] != first["instance_id"]
  await conn.call("release", {"env": "counter", "chain_id": "d"})
  # Release resets a reusable instance; a new chain reuses it without the old count.
  assert (await conn.call("release", args)) == {"released": True}
  assert (await conn.call("release", args)) == {"released": False}
  with trio.fail_after(5):
    while True:
      again = await conn.call("acquire", {"env": "counter", "chain_id": "c2"})
      if again["instance_id"] in (first["instance_id"], other["instance_id"]):
        break
      await conn.call("release", {"env": "counter", "chain_id": "c2"})
      await trio.sleep(0.05)
  step = await conn.call("step", {"env": "counter", "chain_id": "c2", "action": None})
  assert step["observation"] == "count=1"
  await conn.aclose()


@pytest.mark.trio
async def test_blocking_envs_run_in_threads_concurrently(server):
  conn = await connect(server)
  for i in range(4):
    await conn.call("acquire", {"env": "blocking_sleep", "chain_id": f"b{i}"})
  finished, threads = [], set()

  async def blocking_call(i):
    result = await conn.call("step", {"env": "blocking_sleep", "chain_id": f"b{i}", "action": {"sleep_s": 0.8}})
    threads.add(result["info"]["thread"])
    finished.append(i)

  start = time.monotonic()
  async with trio.open_nursery() as nursery:
    for i in range(4):
      nursery.start_soon(blocking_call, i)
    await trio.sleep(0.1)
    await conn.call("health")  # the server answers while all four block in their threads
    answered_while_blocked = not finished
  assert answered_while_blocked
  assert len(threads) == 4
  assert time.monotonic() - start < 2.4  # serially it would take 3.2 s
  await conn.aclose()


@pytest.mark.trio
async def test_error_replies_and_server_keeps_serving(server):
  conn = await connect(server)
  bad = [
    ("nope", {}, "UnknownOp"),
    ("acquire", {"env": "no_such_env", "chain_id": "x"}, "UnknownEnv"),
    ("acquire", {"chain_id": "x"}, "BadRequest"),
    ("acquire", {"env": 3, "chain_id": "x"}, "BadRequest"),
    ("acquire", {"env": "echo", "chain_id": ["x"]}, "BadRequest"),
    ("acquire", {"env": "echo", "chain_id": "x", "wait_s": "soon"}, "BadRequest"),
    ("acquire", {"env": "echo", "chain_id": "x", "wait_s": -1}, "BadRequest"),
    ("step", {"env": "echo", "chain_id": "never-acquired", "action": 1}, "NotAcquired"),
    ("reset", {"env": "counter", "chain_id": "r", "row": [1]}, "BadRequest"),
    ("step", {"env": "echo", "chain_id": "x"}, "BadRequest"),
    ("step", {"env": "echo", "chain_id": "x", "action": 1, "timeout_s": 0}, "BadRequest"),
    ("compute_reward", {"env": "echo", "chain_id": "x", "name": "nope"}, "EnvError"),
    ("compute_reward", {"env": "echo", "chain_id": "x", "name": "length", "kwargs": 5}, "BadRequest"),
    ("compute_reward", {"env": "counter", "chain_id": "r", "name": "steps", "kwargs": {"scale": "big"}}, "EnvError"),
    ("reset", {"env": "counter", "chain_id": "r", "row": {"max_steps": "ten"}}, "EnvError"),
  ]
  await conn.call("acquire", {"env": "echo", "chain_id": "x"})
  await conn.call("acquire", {"env": "counter", "chain_id": "r"})
  for op, args, error_type in bad:
    with pytest.raises(protocol.RemoteError) as info:
      await conn.call(op, args)
    assert info.value.error_type == error_type, (op, args, info.value)
  # The message names what was wrong.
  with pytest.raises(protocol.RemoteError, match="'wait_s'"):
    await conn.call("acquire", {"env": "echo", "chain_id": "x2", "wait_s": "soon"})
  with pytest.raises(protocol.RemoteError, match="max_steps"):
    await conn.call("reset", {"env": "counter", "chain_id": "r", "row": {"max_steps": 0}})
  assert (await conn.call("step", {"env": "echo", "chain_id": "x", "action": "ok"}))["observation"] == "ok"
  await conn.aclose()


@pytest.mark.trio
async def test_pool_exhausted_then_wait_for_release(server):
  conn = await connect(server)
  for i in range(2):
    await conn.call("acquire", {"env": "counter", "chain_id": f"full{i}"})
  with pytest.raises(protocol.RemoteError) as info:
    await conn.call("acquire", {"env": "counter", "chain_id": "third"})
  assert info.value.error_type == protocol.POOL_EXHAUSTED
  async with trio.open_nursery() as nursery:

    async def release_later():
      await trio.sleep(0.3)
      await conn.call("release", {"env": "counter", "chain_id": "full0"})

    nursery.start_soon(release_later)
    start = time.monotonic()
    await conn.call("acquire", {"env": "counter", "chain_id": "third", "wait_s": 5})
    assert 0.25 < time.monotonic() - start < 3
  stats = (await conn.call("stats"))["pools"]["counter"]
  assert stats["live"] <= 2 and stats["peak_live"] <= 2 and stats["exhausted"] >= 1
  await conn.aclose()


@pytest.mark.trio
async def test_pool_caps_hold_under_load(server):
  """48 chains over 4 connections contend for 4 `sleep` instances; live never exceeds 4."""
  conns = [await connect(server) for _ in range(4)]
  observed = []
  done = trio.Event()

  async def poll_stats():
    while not done.is_set():
      observed.append((await conns[0].call("stats"))["pools"]["sleep"])
      await trio.sleep(0.01)

  async def chain(i):
    conn = conns[i % 4]
    args = {"env": "sleep", "chain_id": f"load{i}"}
    await conn.call("acquire", {**args, "wait_s": 30})
    await conn.call("step", {**args, "action": {"sleep_s": 0.03}})
    await conn.call("release", args)

  with trio.fail_after(30):
    async with trio.open_nursery() as outer:
      outer.start_soon(poll_stats)
      async with trio.open_nursery() as nursery:
        for i in range(48):
          nursery.start_soon(chain, i)
      done.set()
  assert observed and max(s["live"] for s in observed) <= 4
  assert max(s["in_use"] for s in observed) == 4  # the load did saturate the pool
  final = (await conns[0].call("stats"))["pools"]["sleep"]
  assert final["peak_live"] <= 4 and final["acquires"] >= 48
  for conn in conns:
    await conn.aclose()


@pytest.mark.trio
async def test_closed_connection_releases_its_chains(server):
  conn = await connect(server)
  for i in range(2):
    await conn.call("acquire", {"env": "counter", "chain_id": f"gone{i}"})
  await conn.aclose()
  other = await connect(server)
  with trio.fail_after(5):  # the server frees them once it sees the connection close
    while (await other.call("stats"))["pools"]["counter"]["in_use"]:
      await trio.sleep(0.05)
  await other.call("acquire", {"env": "counter", "chain_id": "gone0"})  # a new binding
  await other.aclose()


# -- malformed input ----------------------------------------------------------------------------


async def _raw(server):
  """A raw connection, past the server's hello frame."""
  host, port = protocol.parse_address(server.address)
  stream = await trio.open_tcp_stream(host, port)
  hello = await _read_reply(stream)
  assert hello["hello"]["auth"] is None and hello["hello"]["protocol"] == 1
  return stream


async def _read_reply(stream) -> dict | None:
  reader = protocol.FrameReader(stream)
  body = await reader.read_body()
  return None if body is None else protocol.decode_body(body)


@pytest.mark.trio
async def test_malformed_frames_get_error_replies(server):
  stream = await _raw(server)
  for body in (
    b"not json",
    b"[]",
    b"\xff\xff",
    b'{"id": 1}',
    b'{"id": [1], "op": "health"}',
    b'{"id": 2, "op": "health", "args": []}',
    b'{"id": true, "op": "health"}',
  ):
    await stream.send_all(struct.pack(">I", len(body)) + body)
    reply = await _read_reply(stream)
    assert reply["ok"] is False and reply["error"]["type"] in ("BadFrame", "BadRequest"), reply
  # Still usable after errors.
  await stream.send_all(protocol.encode_frame({"id": 9, "op": "health"}))
  assert (await _read_reply(stream))["result"]["status"] == "ok"
  # An oversized length header: an error reply, then the server closes this connection.
  await stream.send_all(struct.pack(">I", 2**31))
  reply = await _read_reply(stream)
  assert reply["error"]["type"] == "FrameTooLarge"
  assert await stream.receive_some(10) == b""
  await stream.aclose()
  conn = await connect(server)
  assert (await conn.call("health"))["status"] == "ok"
  await conn.aclose()


def _random_frame(rng) -> bytes:
  kind = rng.randrange(6)
  if kind == 0:
    body = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
  else:
    values = [None, True, -1, 3.5, "x", "echo", "counter", [], {}, [1, "a"], {"k": {"n": None}}, "a" * 200, 2**70]
    ops = ["health", "stats", "acquire", "release", "reset", "step", "compute_reward", "", "??"]
    message = {"id": rng.choice([rng.randrange(10**6), "s", None, [1], 1.5]), "op": rng.choice(ops + values)}
    if rng.random() < 0.9:
      args = {
        k: rng.choice(values)
        for k in rng.sample(
          ["env", "chain_id", "action", "row", "name", "kwargs", "wait_s", "timeout_s", "zzz"], rng.randrange(6)
        )
      }
      if rng.random() < 0.5:
        args["env"] = rng.choice(["echo", "counter"])
        args["chain_id"] = rng.choice(["f1", "f2"])
      message["args"] = args if rng.random() < 0.95 else rng.choice(values)
    body = json.dumps(message).encode()
    if kind == 5:  # corrupt some bytes
      body = bytearray(body)
      for _ in range(3):
        body[rng.randrange(len(body))] = rng.randrange(256)
      body = bytes(body)
  return struct.pack(">I", len(body)) + body


@pytest.mark.trio
async def test_fuzz_random_frames(server):
  """3,000 random frames on one connection: every frame gets exactly one reply, no crash."""
  import random

  rng = random.Random(1234)
  stream = await _raw(server)
  frames = [_random_frame(rng) for _ in range(3000)]
  replies = []
  with trio.fail_after(60):
    async with trio.open_nursery() as nursery:

      async def read_all():
        reader = protocol.FrameReader(stream)
        while len(replies) < len(frames):
          replies.append(protocol.decode_body(await reader.read_body()))

      nursery.start_soon(read_all)
      for start in range(0, len(frames), 100):
        await stream.send_all(b"".join(frames[start : start + 100]))
  assert len(replies) == 3000
  assert all(isinstance(r.get("ok"), bool) for r in replies)
  assert sum(not r["ok"] for r in replies) > 2000  # most random frames are errors...
  assert any(r["ok"] for r in replies)  # ...some are valid calls
  await stream.aclose()
  conn = await connect(server)
  stats = await conn.call("stats")
  assert stats["status"] == "ok" and stats["bad_frames"] >= 100
  await conn.aclose()


# -- process-level --------------------------------------------------------------------------------


def test_cli_rejects_unknown_env_type():
  result = subprocess.run(
    [sys.executable, "-m", "envservers", "--port", "0", "--env", "nope=2"], capture_output=True, text=True, timeout=60
  )
  assert result.returncode == 2 and "unknown env type 'nope'" in result.stderr
  result = subprocess.run(
    [sys.executable, "-m", "envservers", "--port", "0", "--env", "echo=x"], capture_output=True, text=True, timeout=60
  )
  assert result.returncode == 2 and "--env 'echo=x'" in result.stderr
  for opt, needle in [
    ("python_sandbox.memory_mb=-1", "'memory_mb' must be a positive number"),
    ("python_sandbox.colour=1", "unexpected keyword argument 'colour'"),
    ("echo.x=1", "env 'echo' takes no options"),
  ]:
    env = opt.split(".")[0]
    result = subprocess.run(
      [sys.executable, "-m", "envservers", "--port", "0", "--env", f"{env}=1", "--env-opt", opt],
      capture_output=True,
      text=True,
      timeout=60,
    )
    assert result.returncode == 2 and needle in result.stderr, (opt, result.stderr)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_drains_inflight_calls_then_exits(signum):
  with running_server("sleep=2:1") as server:

    async def main():
      conn = await connect(server)
      await conn.call("acquire", {"env": "sleep", "chain_id": "s"})
      async with trio.open_nursery() as nursery:
        result = {}

        async def slow_call():
          result["step"] = await conn.call("step", {"env": "sleep", "chain_id": "s", "action": {"sleep_s": 0.5}})

        nursery.start_soon(slow_call)
        await trio.sleep(0.1)
        server.process.send_signal(signum)
      assert result["step"]["observation"] == "slept"  # the in-flight call finished
      with pytest.raises(ConnectionLost):
        await trio.sleep(0.2)
        await conn.call("health")

    trio.run(main)
    assert server.process.wait(timeout=10) == 0


def test_import_flag_registers_user_env_types(tmp_path, monkeypatch):
  (tmp_path / "my_envs.py").write_text(
    "from envservers import BlockingEnv, StepOutcome, env_reward, register_env\n"
    "@register_env\n"
    "class Upper(BlockingEnv):\n"
    "  name = 'upper'\n"
    "  def step_blocking(self, action):\n"
    "    return StepOutcome(observation=str(action).upper(), reward=0.5)\n"
    "  @env_reward('len')\n"
    "  def len_reward(self, text):\n"
    "    return len(text)\n"
  )
  monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
  with running_server("upper=1", extra=("--import", "my_envs")) as server:

    async def main():
      conn = await connect(server)
      await conn.call("acquire", {"env": "upper", "chain_id": "u"})
      step = await conn.call("step", {"env": "upper", "chain_id": "u", "action": "abc"})
      reward = await conn.call(
        "compute_reward", {"env": "upper", "chain_id": "u", "name": "len", "kwargs": {"text": "four"}}
      )
      await conn.aclose()
      return step, reward

    step, reward = trio.run(main)
  assert (step["observation"], step["reward"]) == ("ABC", 0.5) and reward == {"reward": 4.0}
  result = subprocess.run(
    [sys.executable, "-m", "envservers", "--import", "no_such_module_x"], capture_output=True, text=True, timeout=60
  )
  assert result.returncode == 2 and "--import no_such_module_x: ModuleNotFoundError" in result.stderr


@pytest.mark.trio
async def test_release_during_a_call_keeps_the_live_count_right(server):
  conn = await connect(server)
  args = {"env": "sleep", "chain_id": "mid-release"}
  await conn.call("acquire", args)
  async with trio.open_nursery() as nursery:
    nursery.start_soon(conn.call, "step", {**args, "action": {"sleep_s": 0.3}})
    await trio.sleep(0.05)
    await conn.call("release", args)
  await trio.sleep(0.2)
  stats = (await conn.call("stats"))["pools"]["sleep"]
  assert stats["live"] == stats["idle"] + stats["in_use"] + stats["starting"]
  assert 0 <= stats["live"] <= stats["cap"]
  await conn.aclose()


def test_envservers_imports_no_jax_and_no_agentfly():
  code = (
    "import sys, envservers, envservers.envs, envservers.__main__, envservers.client\n"
    "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'agentfly_jax', 'flax')]\n"
    "print(bad)"
  )
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert result.returncode == 0 and result.stdout.strip() == "[]", result


def _json_strategy():
  from hypothesis import strategies as st

  leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False)
  )
  return st.dictionaries(
    st.text(max_size=8),
    st.recursive(
      leaves,
      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
      max_leaves=12,
    ),
    max_size=5,
  )


def test_frames_survive_any_chunking():
  """Property: any JSON objects, cut into any chunk sizes, read back equal and in order."""
  from hypothesis import given, settings, strategies as st

  @settings(max_examples=60, deadline=None)
  @given(st.lists(_json_strategy(), min_size=1, max_size=6), st.lists(st.integers(1, 50), min_size=1, max_size=20))
  def check(messages, cuts):
    data = b"".join(protocol.encode_frame(m) for m in messages)

    async def main():
      send, receive = trio.testing.memory_stream_pair()
      reader = protocol.FrameReader(receive)
      got = []
      async with trio.open_nursery() as nursery:

        async def feed():
          position, i = 0, 0
          while position < len(data):
            step = cuts[i % len(cuts)]
            await send.send_all(data[position : position + step])
            position, i = position + step, i + 1
          await send.aclose()

        nursery.start_soon(feed)
        while (body := await reader.read_body()) is not None:
          got.append(protocol.decode_body(body))
      return got

    assert trio.run(main) == messages

  check()


def test_back_pressure_bounds_inflight_requests_per_connection():
  """With max_inflight_per_connection=8, a client sending 200 slow calls at once never has more
  than 8 running on the server; all 200 still get their replies."""
  import envservers.envs  # noqa: F401
  from envservers.server import EnvServer

  async def main():
    server = EnvServer({"sleep": (200, 0)}, max_inflight_per_connection=8)
    async with trio.open_nursery() as nursery:
      port = await nursery.start(lambda task_status: server.serve("127.0.0.1", 0, task_status=task_status))
      conn = await Connection.open(f"127.0.0.1:{port}")
      for i in range(200):
        await conn.call("acquire", {"env": "sleep", "chain_id": str(i)})
      peak = 0

      async def watch():
        nonlocal peak
        while True:
          peak = max(peak, server.inflight)
          await trio.sleep(0)

      nursery.start_soon(watch)
      async with trio.open_nursery() as calls:
        for i in range(200):
          calls.start_soon(conn.call, "step", {"env": "sleep", "chain_id": str(i), "action": {"sleep_s": 0.01}})
      assert (await conn.call("stats"))["pools"]["sleep"]["calls"] == 200
      server.shutdown()
      nursery.cancel_scope.cancel()
    return peak

  assert 1 <= trio.run(main) <= 8
