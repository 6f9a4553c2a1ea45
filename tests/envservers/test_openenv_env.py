"""The `openenv` env type against real OpenEnv servers (openenv-core under uvicorn on loopback):
one the test starts and names by URL, one the env server starts per pool from `app` (as options,
or named by each row); the action text fills the action's one field, rewards and done are
OpenEnv's; a URL that does not answer is an error naming it, and the server serves on."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from envservers.envs.openenv_env import OpenEnvEnv
from envservers_helpers import running_server

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def openenv_server():
  port = _free_port()
  process = subprocess.Popen(
    [sys.executable, "-m", "uvicorn", "openenv_number_env:app", "--port", str(port), "--log-level", "warning"],
    cwd=TESTS,
  )
  url = f"http://127.0.0.1:{port}"
  try:
    for _ in range(200):
      try:
        urllib.request.urlopen(url + "/health", timeout=1).read()
        break
      except OSError:
        time.sleep(0.05)
    yield url
  finally:
    process.terminate()
    process.wait(timeout=10)


async def _play(manager, chain: str) -> tuple[list, dict, str]:
  """Binary search on the hints: the env's done (a right guess) ends it."""
  env = await manager.acquire("openenv", chain)
  opening = await env.reset({"seed": 7})
  low, high, results = 1, 20, []
  while True:
    guess = (low + high) // 2
    result = await env.step(str(guess))
    results.append(result)
    if result.done:
      break
    low, high = (guess + 1, high) if "higher" in result.observation else (low, guess - 1)
  ret = await env.compute_reward("return")
  state = (await env.step({"query": "state"})).observation
  bad = await env.step('{"nope": 1}')
  await manager.release("openenv", chain)
  return results, {"return": ret, "opening": opening, "state": state}, bad


def _check(results, extra, bad):
  assert "Guess a number" in extra["opening"]
  assert results[-1].reward == 1.0 and '"Right!"' in results[-1].observation
  assert all(r.reward == 0.0 and not r.done for r in results[:-1]) and len(results) <= 5
  assert extra["return"]["reward"] == 1.0 and extra["return"]["steps"] == len(results)
  assert f'"step_count": {len(results)}' in extra["state"]
  assert bad.info["error"] == "EpisodeOver"


def test_openenv_server_at_a_url_and_a_bad_url(tmp_path):
  with openenv_server() as url:
    with running_server("openenv=2:0", options=(f"openenv.url={url}",)) as server:

      async def main():
        manager = EnvManager([server.address])
        out = await _play(manager, "a")
        env = await manager.acquire("openenv", "b")
        await env.reset({"seed": 1})
        refused = await env.step('{"nope": 1}')
        await manager.release("openenv", "b")
        await manager.aclose()
        return out, refused

      (results, extra, bad), refused = trio.run(main)
  _check(results, extra, bad)
  assert refused.info["error"] == "BadAction" and "guess" in refused.observation and "refused" in refused.observation
  dead = f"http://127.0.0.1:{_free_port()}"
  with running_server("openenv=1:0", options=(f"openenv.url={dead}",)) as server:

    async def bad_url():
      manager = EnvManager([server.address])
      with pytest.raises(Exception, match=dead.replace(".", r"\.")):
        env = await manager.acquire("openenv", "c")
        await env.reset({"seed": 1})
      stats = await manager.server_stats()  # the server serves on
      await manager.aclose()
      return stats

    assert trio.run(bad_url)


def test_each_chain_resets_the_openenv_server_once_with_its_seed():
  """Two chains in turn on one instance: the user's server sees one reset per chain, each with the
  row's seed (a released instance is not reset again without a row)."""
  with openenv_server() as url:
    with running_server("openenv=1:0", options=(f"openenv.url={url}",)) as server:

      async def main():
        manager = EnvManager([server.address])
        ids = []
        for chain, seed in (("a", 7), ("b", 3)):
          env = await manager.acquire("openenv", chain)
          ids.append(env.info["instance_id"])
          await env.reset({"seed": seed})
          await env.step("10")
          await manager.release("openenv", chain)
        await trio.sleep(0.5)  # what the server does after the last release, in the background
        stats = (await manager.server_stats())[server.address]["pools"]["openenv"]
        await manager.aclose()
        return ids, stats

      ids, stats = trio.run(main)
      with urllib.request.urlopen(url + "/resets", timeout=5) as reply:
        resets = json.loads(reply.read())
  assert resets == [7, 3] and ids[0] == ids[1]
  assert stats["recycled"] == 0 and stats["reset_failures"] == 0


def test_openenv_app_started_per_pool(monkeypatch):
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
  with running_server("openenv=2:0", options=("openenv.app=openenv_number_env:app",)) as server:

    async def main():
      manager = EnvManager([server.address])
      out = [await _play(manager, "x"), await _play(manager, "y")]
      await manager.aclose()
      return out

    for results, extra, bad in trio.run(main):
      _check(results, extra, bad)


def test_options_are_checked():
  with pytest.raises(ValueError, match="at most one"):
    OpenEnvEnv(url="http://x", app="m:a")
  with pytest.raises(ValueError, match="'url'"):
    OpenEnvEnv(url="ftp://x")
  with pytest.raises(ValueError, match="module:attr"):
    OpenEnvEnv(app="nocolon")


def test_rows_name_the_server(monkeypatch):
  """No env options: each row's openenv_url / openenv_app names its server (a row naming none is
  an error naming the fields); the session moves between servers at reset."""
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
  with openenv_server() as url, running_server("openenv=1:0") as server:

    async def main():
      manager = EnvManager([server.address])
      env = await manager.acquire("openenv", "r")
      with pytest.raises(Exception, match="openenv_url"):
        await env.reset({"seed": 1})
      openings = [await env.reset({"seed": 1, "openenv_url": url})]
      hints = [(await env.step("10")).observation]
      openings.append(await env.reset({"seed": 1, "openenv_app": "openenv_number_env:app"}))
      hints.append((await env.step("10")).observation)
      await manager.release("openenv", "r")
      await manager.aclose()
      return openings, hints

    openings, hints = trio.run(main)
  assert all("Guess a number" in o for o in openings)
  assert hints[0] == hints[1] and any(h in hints[0] for h in ("higher", "lower", "Right!"))


def test_a_full_openenv_server_is_named(monkeypatch):
  """An OpenEnv server at its max_concurrent_envs refuses a second session: the error says so."""
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
  with running_server("openenv=2:0", options=("openenv.app=openenv_number_env:app_one",)) as server:

    async def main():
      manager = EnvManager([server.address])
      first = await manager.acquire("openenv", "one")
      opening = await first.reset({"seed": 1})
      second = await manager.acquire("openenv", "two")
      with pytest.raises(Exception, match=r"capacity.*max_concurrent_envs") as refused:
        await second.reset({"seed": 1})
      await manager.aclose()
      return opening, str(refused.value)

    opening, refused = trio.run(main)
  assert "Guess a number" in opening and "1/1" in refused


class _FullServerSocket:
  """A session socket whose first message in is the full server's error (the order a loaded
  machine may see: the connect-time error read as the reply to the first call)."""

  def send(self, text):
    pass

  def recv(self, timeout=None):
    message = "Server at capacity: 1/1 sessions active. Cannot accept new connections."
    return json.dumps({"type": "error", "data": {"message": message, "code": "CAPACITY_REACHED"}})


def test_a_full_server_read_as_a_reply_says_what_to_change():
  env = OpenEnvEnv(url="http://127.0.0.1:1")
  env.ws = _FullServerSocket()
  with pytest.raises(ValueError, match=r"refused 'reset': Server at capacity.*max_concurrent_envs"):
    env._call({"type": "reset", "data": {}})
