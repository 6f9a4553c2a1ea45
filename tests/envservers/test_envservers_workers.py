"""Envs that run in a process of their own (`run_in_subprocess`): crashes, kills and hangs cost
only that instance, which is recycled; other chains are unaffected; caps count processes."""

from __future__ import annotations

import pytest
import trio

from envservers import protocol
from envservers_helpers import child_pids, connect, kill, running_server, wait_until

pytestmark = pytest.mark.timeout(120)
CAP = 3


@pytest.fixture(scope="module")
def server():
  with running_server(f"worker_echo={CAP}:1", options=('worker_echo.prefix="> "',)) as s:
    yield s


def _workers(server_pid: int) -> list[int]:
  pids = []
  for pid in child_pids(server_pid):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"envservers.worker" in f.read():
          pids.append(pid)
    except OSError:
      pass
  return pids


def _args(chain_id):
  return {"env": "worker_echo", "chain_id": chain_id}


@pytest.mark.trio
async def test_worker_env_round_trip(server):
  conn = await connect(server)
  args = _args("w")
  info = await conn.call("acquire", args)
  assert info["worker_pid"] in _workers(server.process.pid)
  assert (await conn.call("reset", {**args, "row": None}))["observation"] == "> ready"
  step = await conn.call("step", {**args, "action": {"k": 1}})
  assert step["observation"] == '> {"k": 1}' and step["info"] == {"steps": 1}  # no stdout noise
  pid = int((await conn.call("step", {**args, "action": "pid"}))["observation"])
  assert pid == info["worker_pid"]
  with pytest.raises(protocol.RemoteError, match="asked to raise"):
    await conn.call("step", {**args, "action": "raise"})
  # An exception in env code does not cost the instance.
  assert int((await conn.call("step", {**args, "action": "pid"}))["observation"]) == pid
  assert await conn.call("compute_reward", {**args, "name": "steps"}) == {"reward": 4.0}
  await conn.call("release", args)
  await conn.aclose()


@pytest.mark.trio
async def test_crash_and_kill_mid_episode_recycle_only_that_chain(server):
  conn = await connect(server)
  victim, bystander = _args("victim"), _args("bystander")
  victim_pid = (await conn.call("acquire", victim))["worker_pid"]
  bystander_pid = (await conn.call("acquire", bystander))["worker_pid"]
  before = (await conn.call("stats"))["pools"]["worker_echo"]
  results = {}
  async with trio.open_nursery() as nursery:

    async def victim_call():
      results["victim"] = await conn.call("step", {**victim, "action": {"sleep_s": 3}})

    async def bystander_calls():
      results["bystander"] = [(await conn.call("step", {**bystander, "action": i}))["observation"] for i in range(5)]

    nursery.start_soon(victim_call)
    nursery.start_soon(bystander_calls)
    await trio.sleep(0.3)
    kill(victim_pid)
  assert results["victim"]["info"]["error"] == "EnvCrashed"
  assert "killed by SIGKILL" in results["victim"]["observation"]
  assert results["bystander"] == [f"> {i}" for i in range(5)]
  follow = await conn.call("step", {**victim, "action": "pid"})
  assert follow["info"]["restarted"] is True and int(follow["observation"].split("\n")[-1]) != victim_pid
  # The env's own crash (os._exit(3)) is an observation as well.
  crash = await conn.call("step", {**bystander, "action": "crash"})
  assert crash["info"]["error"] == "EnvCrashed" and "exited with status 3" in crash["observation"]
  after = (await conn.call("stats"))["pools"]["worker_echo"]
  assert after["crashes"] == before["crashes"] + 2

  async def crashed_worker_reaped():
    return bystander_pid not in _workers(server.process.pid)

  await wait_until(crashed_worker_reaped, timeout_s=10)
  for args in (victim, bystander):
    await conn.call("release", args)
  await conn.aclose()


@pytest.mark.trio
async def test_hung_worker_is_killed_at_the_time_limit(server):
  conn = await connect(server)
  args = _args("hung")
  pid = (await conn.call("acquire", args))["worker_pid"]
  result = await conn.call("step", {**args, "action": {"sleep_s": 30}, "timeout_s": 0.5})
  assert result["info"]["error"] == "Timeout"

  async def gone():
    return pid not in _workers(server.process.pid)

  await wait_until(gone, timeout_s=10)
  await conn.call("release", args)
  await conn.aclose()


@pytest.mark.trio
async def test_worker_processes_never_exceed_the_cap(server):
  conns = [await connect(server) for _ in range(2)]
  counts, done = [], trio.Event()

  async def watch():
    while not done.is_set():
      counts.append(len(_workers(server.process.pid)))
      await trio.sleep(0.02)

  async def chain(i):
    conn, args = conns[i % 2], _args(f"load{i}")
    await conn.call("acquire", {**args, "wait_s": 60})
    assert (await conn.call("step", {**args, "action": i}))["observation"] == f"> {i}"
    await conn.call("release", args)

  with trio.fail_after(90):
    async with trio.open_nursery() as outer:
      outer.start_soon(watch)
      async with trio.open_nursery() as nursery:
        for i in range(4 * CAP):
          nursery.start_soon(chain, i)
      done.set()
  assert counts and max(counts) <= CAP
  for conn in conns:
    await conn.aclose()


@pytest.mark.trio
async def test_client_gone_mid_call_cancels_it_and_recycles_the_instance(server):
  conn = await connect(server)
  args = _args("leaver")
  pid = (await conn.call("acquire", args))["worker_pid"]
  before = (await conn.call("stats"))["pools"]["worker_echo"]["recycled"]
  async with trio.open_nursery() as nursery:

    async def doomed():
      with pytest.raises(Exception):
        await conn.call("step", {**args, "action": {"sleep_s": 4}})

    nursery.start_soon(doomed)
    await trio.sleep(0.3)
    await conn.aclose()  # the client goes away mid-call
  other = await connect(server)

  async def recycled():
    stats = (await other.call("stats"))["pools"]["worker_echo"]
    return stats["recycled"] > before and pid not in _workers(server.process.pid)

  with trio.fail_after(3):  # well before the 4 s call would have ended
    await wait_until(recycled, timeout_s=3)
  # A fresh chain never sees the cancelled call's late reply.
  await other.call("acquire", _args("next"))
  for i in range(3):
    assert (await other.call("step", {**_args("next"), "action": i}))["observation"] == f"> {i}"
  await other.aclose()
