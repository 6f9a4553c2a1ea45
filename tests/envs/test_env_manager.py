"""EnvManager (trainer side) against real env servers: spreading, back-off, reconnect, metrics,
and default_provider()."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

import pytest
import trio

from agentfly_jax.envs import Env, EnvManager, EnvProvider, EnvUnavailable, StepResult
from agentfly_jax.envs.local_server import LocalEnvServer
from envservers_helpers import kill, running_server, sandbox_unavailable_reason

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def two_servers():
  with running_server("echo=2:1", "counter=2:1") as a, running_server("echo=2:1") as b:
    yield a, b


def test_contract_and_bad_addresses():
  manager = EnvManager(["127.0.0.1:1"])
  assert isinstance(manager, EnvProvider)
  for bad in ([], ["localhost"], ["127.0.0.1:99999"]):
    with pytest.raises(ValueError):
      EnvManager(bad)
  assert EnvManager("127.0.0.1:5,127.0.0.1:6").servers == ["127.0.0.1:5", "127.0.0.1:6"]


@pytest.mark.trio
async def test_spreads_chains_and_reports_metrics(two_servers):
  a, b = two_servers
  manager = EnvManager([a.address, b.address])
  envs = [await manager.acquire("echo", f"c{i}") for i in range(4)]
  assert isinstance(envs[0], Env)
  assert sorted(e.address for e in envs) == sorted([a.address] * 2 + [b.address] * 2)
  assert await manager.acquire("echo", "c0") is envs[0]  # same chain -> same instance
  step = await envs[3].step({"n": 3})
  assert isinstance(step, StepResult) and step.observation == '{"n": 3}'
  # counter lives only on server a: the manager learns that b does not serve it.
  counter = await manager.acquire("counter", "k")
  assert counter.address == a.address
  assert await counter.reset({"max_steps": 1}) == "count=0 max_steps=1"
  result = await counter.step(None)
  assert (result.observation, result.reward, result.done) == ("count=1", 1.0, True)
  assert await counter.compute_reward("steps", scale=2.0) == {"reward": 2.0, "count": 1}
  metrics = manager.metrics()
  assert metrics["envs/allocated"] == 5 and metrics["envs/allocated/echo"] == 4
  assert metrics["envs/allocated/counter"] == 1 and metrics["envs/allocated_peak"] == 5
  stats = await manager.server_stats()
  assert stats[a.address]["pools"]["echo"]["in_use"] == 2
  assert stats[b.address]["pools"]["echo"]["in_use"] == 2
  for i in range(4):
    await manager.release("echo", f"c{i}")
  await manager.release("counter", "k")
  await manager.release("counter", "never")  # releasing nothing is fine
  assert manager.metrics()["envs/allocated"] == 0
  with pytest.raises(EnvUnavailable, match="no env server serves 'nope'"):
    await manager.acquire("nope", "x")
  await manager.aclose()


@pytest.mark.trio
async def test_backs_off_while_pools_are_full(two_servers):
  a, b = two_servers
  manager = EnvManager([a.address, b.address], acquire_wait_s=0.0, max_backoff_s=0.1)
  held = [await manager.acquire("echo", f"h{i}") for i in range(4)]

  async def release_later():
    await trio.sleep(0.4)
    await manager.release("echo", "h1")

  async with trio.open_nursery() as nursery:
    nursery.start_soon(release_later)
    start = time.monotonic()
    extra = await manager.acquire("echo", "extra")
    waited = time.monotonic() - start
  assert 0.3 < waited < 3 and extra.address == held[1].address
  metrics = manager.metrics()
  assert metrics["envs/pool_full"] >= 2 and metrics["envs/acquire_retries"] >= 1
  assert metrics["envs/backoff_s"] > 0
  impatient = EnvManager([a.address, b.address], acquire_wait_s=0.0, acquire_timeout_s=0.3)
  with pytest.raises(EnvUnavailable, match="within 0.3 s"):
    await impatient.acquire("echo", "no-room")
  await impatient.aclose()
  await manager.aclose()


@pytest.mark.trio
async def test_reconnects_after_server_restart():
  with running_server("echo=2:1") as first:
    address = first.address
    port = address.rsplit(":", 1)[1]
    manager = EnvManager([address], down_retry_s=0.05, acquire_timeout_s=20)
    env = await manager.acquire("echo", "survivor")
    assert (await env.step("before")).observation == "before"
    kill(first.process.pid)
    first.process.wait(10)
    lost = await env.step("during")
    assert lost.info["error"] == "ConnectionLost" and "Error" in lost.observation
    impatient = EnvManager([address], down_retry_s=0.05, acquire_timeout_s=0.5)
    with pytest.raises(EnvUnavailable, match="cannot connect"):
      await impatient.acquire("echo", "while-down")  # nothing listens: backs off, gives up
  second = LocalEnvServer(["echo=2:1"], extra_args=["--port", port])
  try:
    fresh = await manager.acquire("echo", "new-chain")
    assert (await fresh.step("after")).observation == "after"
    again = await env.step("back")  # the old chain gets a new instance, and is told so
    assert again.observation.endswith("back") and "state is gone" in again.observation
    assert manager.metrics()["envs/reconnects"] >= 1
  finally:
    await manager.aclose()
    second.stop()


@pytest.mark.trio
async def test_chains_waiting_on_a_failing_connect_do_not_each_retry_it():
  """A server that accepts but never greets (hung): the chains that queue behind the first
  connect attempt fail over with it, so the server costs one connect timeout, not one each."""
  accepted = []

  async def never_greets(stream):
    accepted.append(stream)
    await trio.sleep_forever()

  with running_server("echo=8:1") as good:
    async with trio.open_nursery() as nursery:
      listeners = await nursery.start(functools.partial(trio.serve_tcp, never_greets, 0, host="127.0.0.1"))
      hung = "127.0.0.1:%d" % listeners[0].socket.getsockname()[1]
      manager = EnvManager([hung, good.address], connect_timeout_s=0.5, down_retry_s=60)
      envs = [None] * 6

      async def acquire(i):  # round-robin ties: every other chain tries the hung server first
        envs[i] = await manager.acquire("echo", f"w{i}")

      async with trio.open_nursery() as chains:
        for i in range(6):
          chains.start_soon(acquire, i)
      assert [e.address for e in envs] == [good.address] * 6
      assert len(accepted) == 1  # one connect attempt to the hung server, not three
      assert manager.metrics()["envs/servers_down"] == 1
      await manager.aclose()
      nursery.cancel_scope.cancel()


def test_step_counters_are_the_growth_since_a_mark(two_servers):
  a, b = two_servers
  manager = EnvManager([a.address, b.address])

  async def acquire(chains):
    for chain in chains:
      await manager.acquire("echo", chain)
    await manager.aclose()

  start = manager.usage_mark()
  trio.run(acquire, ["s1", "s2", "s3"])
  first = manager.usage_since(start).counters
  assert first["acquires"] == 3 and first["connects"] == 2 and first["timeouts"] == 0
  mark = manager.usage_mark()
  assert set(manager.usage_since(mark).counters.values()) == {0}  # nothing since
  trio.run(acquire, ["s4"])
  second = manager.usage_since(mark).counters
  assert second["acquires"] == 1 and second["connects"] == 1
  assert manager.usage_since(start).counters["acquires"] == 4  # reading reset nothing
  assert manager.usage_since(None).counters == manager.usage_since(start).counters  # None: since made
  assert manager.usage_since(None).peaks["echo"] == 3 and manager.usage_since(mark).peaks["echo"] == 1
  assert sum(map(len, manager.usage_since(mark).waits.values())) == 1
  totals = manager.metrics()
  assert all(totals[f"envs/{k}"] == first[k] + second[k] for k in first)


@pytest.mark.trio
async def test_manager_errors_become_observations(two_servers):
  a, _ = two_servers
  manager = EnvManager([a.address])
  env = await manager.acquire("echo", "obs")
  result = await env.step({1, 2})  # not JSON
  assert result.info["error"] == "BadAction" and "cannot be sent" in result.observation
  with pytest.raises(EnvUnavailable, match="no reward 'nope'"):
    await env.compute_reward("nope")
  await manager.aclose()


def test_works_across_separate_trio_runs(two_servers):
  a, _ = two_servers
  manager = EnvManager([a.address])

  async def once(text):
    env = await manager.acquire("echo", "same-id")
    observation = (await env.step(text)).observation
    await manager.release("echo", "same-id")
    return observation

  assert [trio.run(once, f"run{i}") for i in range(3)] == ["run0", "run1", "run2"]


@pytest.mark.skipif(sandbox_unavailable_reason() is not None, reason=str(sandbox_unavailable_reason()))
def test_default_provider_starts_a_local_server_and_stops_it_at_exit(tmp_path):
  script = tmp_path / "one_off.py"
  script.write_text(
    "import json, os, trio\n"
    "from agentfly_jax.envs import default_provider\n"
    "from agentfly_jax.envs import local_server\n"
    "async def main():\n"
    "  provider = default_provider()\n"
    "  env = await provider.acquire('python_sandbox', 'c0')\n"
    "  a = (await env.step('x = 6 * 7')).observation\n"
    "  b = (await env.step('print(x)')).observation\n"
    "  return a, b\n"
    "a, b = trio.run(main)\n"
    "assert default_provider() is default_provider()\n"
    "print(json.dumps({'obs': [a, b], 'server_pid': local_server._local_server.process.pid,\n"
    "                  'address': default_provider().servers}))\n"
  )
  env = {k: v for k, v in os.environ.items() if k != "AGENTFLY_ENV_SERVERS"}
  env["AGENTFLY_LOCAL_ENVS"] = "python_sandbox=2:1"
  result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=env)
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["obs"] == ["", "42\n"]
  assert report["address"][0].startswith("127.0.0.1:")
  deadline = time.monotonic() + 10
  while os.path.exists(f"/proc/{report['server_pid']}") and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not os.path.exists(f"/proc/{report['server_pid']}"), "local env server outlived its parent"


def test_default_provider_uses_configured_servers(two_servers, monkeypatch):
  from agentfly_jax.envs import local_server

  a, b = two_servers
  monkeypatch.setenv("AGENTFLY_ENV_SERVERS", f"{a.address}, {b.address}")
  monkeypatch.setattr(local_server, "_default", None)
  # an earlier test in this process may have started the embedded server: hide it here
  monkeypatch.setattr(local_server, "_local_server", None)
  provider = local_server.default_provider()
  assert provider.servers == [a.address, b.address] and local_server._local_server is None

  async def main():
    env = await provider.acquire("echo", "configured")
    return (await env.step("hi")).observation

  assert trio.run(main) == "hi"
  monkeypatch.setattr(local_server, "_default", None)


@pytest.mark.trio
async def test_oversized_action_is_an_observation(two_servers):
  a, _ = two_servers
  manager = EnvManager([a.address])
  env = await manager.acquire("echo", "huge")
  result = await env.step("x" * (17 * 1024 * 1024))
  assert result.info["error"] == "BadAction" and "exceeds the limit" in result.observation
  assert (await env.step("small")).observation == "small"  # the connection is still fine
  await manager.aclose()


@pytest.mark.trio
async def test_concurrent_acquires_of_one_chain_share_one_instance(two_servers):
  a, b = two_servers
  manager = EnvManager([a.address, b.address])
  got = []

  async def grab():
    got.append(await manager.acquire("echo", "twin"))

  async with trio.open_nursery() as nursery:
    for _ in range(4):
      nursery.start_soon(grab)
  assert all(env is got[0] for env in got)
  await manager.release("echo", "twin")
  stats = await manager.server_stats()
  with trio.fail_after(5):  # nothing stays bound on either server
    while any(s["pools"]["echo"]["in_use"] for s in stats.values()):
      await trio.sleep(0.05)
      stats = await manager.server_stats()
  await manager.aclose()


def test_outside_trio_is_a_clear_error():
  import asyncio

  manager = EnvManager(["127.0.0.1:1"])
  with pytest.raises(RuntimeError, match="inside trio.run"):
    asyncio.run(manager.acquire("echo", "c"))
