"""The `swe` env: actions and their errors, the hidden-test reward against pytest on the host,
hostile commands contained (the server serves on), isolation of episodes, crash recycling."""

from __future__ import annotations

import os
import time

import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from envservers.envs.swe import SweEnv, parse_lines
from tests import swe_testlib
from envservers_helpers import (
  kill,
  process_ended,
  running_server,
  sandbox_unavailable_reason,
  server_stats,
  wait_until,
)

pytestmark = [
  pytest.mark.timeout(300),
  pytest.mark.skipif(sandbox_unavailable_reason() is not None, reason=str(sandbox_unavailable_reason())),
]
OPTIONS = ("swe.timeout_s=3", "swe.repo_mb=24", "swe.tmp_mb=16", "swe.file_size_mb=8")


@pytest.fixture(scope="module")
def task_row(tmp_path_factory):
  return swe_testlib.make_task(tmp_path_factory.mktemp("swe_task"))


@pytest.fixture(scope="module")
def server():
  with running_server("swe=4:1", options=OPTIONS) as server:
    yield server


def test_actions_and_their_errors(task_row):
  async def main():
    env = SweEnv(max_output_bytes=600)
    await env.start()
    try:
      first = await env.reset(task_row)
      assert "add() subtracts." in first and "python -m pytest -q tests" in first
      out = await env.step({"action": "bash", "command": "python -m pytest -q tests"})
      assert "1 failed, 1 passed" in out.observation and out.info["exit_code"] == 1
      out = await env.step({"action": "view", "path": "pkg/m.py", "lines": [4, 5]})
      assert out.observation.splitlines()[1:] == ["   4  ", "   5  def double(x):"]
      out = await env.step({"action": "view", "path": "/repo", "lines": None})
      assert "pkg/m.py" in out.observation and "tests/test_m.py" in out.observation
      cases = {  # action -> words the error observation must carry
        ("str_replace", "pkg/m.py", "a * b", "x"): "not found in /repo/pkg/m.py (0 matches)",
        ("str_replace", "pkg/m.py", "  return ", "x"): "occurs 3 times",
        ("str_replace", "nope.py", "a", "b"): "/repo/nope.py is not a file",
        ("view", "nope.py", None, None): "No such file",
        ("view", "pkg/m.py", "40-50", None): "has 10 lines; start 40 is past its end",
      }
      for (kind, path, a, b), words in cases.items():
        action = (
          {"action": kind, "path": path, "old": a, "new": b}
          if kind == "str_replace"
          else {"action": kind, "path": path, "lines": a}
        )
        out = await env.step(action)
        assert words in out.observation and out.info["error"] == "ToolError", (action, out)
      for action, words in [
        ({"action": "rm"}, "'action' one of"),
        (7, "got 'int'"),
        ({"action": "view"}, "argument 'path'"),
        ({"action": "view", "path": "x", "lines": "a-b"}, "argument 'lines'"),
        ({"action": "str_replace", "path": "x", "old": "a"}, "'new'"),
        ({"action": "bash", "command": " "}, "argument 'command'"),
      ]:
        out = await env.step(action)
        assert words in out.observation and out.info["error"] == "BadAction", (action, out)
      out = await env.step({"action": "bash", "command": "seq 1 5000"})
      assert "[output truncated: 23893 bytes in all" in out.observation
      assert out.observation.startswith("1\n2\n") and out.observation.endswith("4999\n5000\n")
      assert len(out.observation.encode()) < 800
      out = await env.step({"action": "str_replace", "path": "pkg/m.py", "old": "a - b", "new": "a + b"})
      assert "Edited /repo/pkg/m.py (1 replacement)" in out.observation
      out = await env.step({"action": "submit"})
      assert out.done and out.reward == 1.0 and out.info == {"passed": 4, "total": 4}
      out = await env.step("ls")
      assert out.done and out.info["error"] == "EpisodeOver"
      with pytest.raises(ValueError, match="field 'repo'"):
        await env.reset({**task_row, "repo": "/no/such/folder"})
    finally:
      await env.close()

  trio.run(main)


def test_parse_lines():
  assert parse_lines(None) == (1, None) and parse_lines("3-9") == (3, 9)
  assert parse_lines([2, -1]) == (2, -1) and parse_lines(5) == (5, None)
  for bad in ("x", [0, 3], [5, 2], [1, 2, 3], True, {"a": 1}):
    with pytest.raises(ValueError, match="'lines'"):
      parse_lines(bad)


def test_reward_matches_pytest_on_the_host_for_random_edits(task_row, tmp_path):
  """The graded fraction equals pytest's own on the host (no sandbox) for random variants of
  the module (each function right or wrong at random)."""
  import numpy as np

  rng = np.random.default_rng(int(time.time()))
  variants = {"a - b": "a + b", "2 * x": "x + x", "x / 2": "x * 0.5"}
  wrong = {"a - b": "a - b", "2 * x": "x * x", "x / 2": "x // 2"}

  async def main():
    env = SweEnv()
    await env.start()
    try:
      for trial in range(3):
        await env.reset(task_row)
        source = swe_testlib.BUGGY_MODULE
        for old in variants:
          new = variants[old] if rng.random() < 0.5 else wrong[old]
          if new != old:
            await env.step({"action": "str_replace", "path": "pkg/m.py", "old": old, "new": new})
          source = source.replace(old, new)
        got = await env.compute_reward("hidden_tests")
        repo = swe_testlib.write({**swe_testlib.FILES, "pkg/m.py": source}, tmp_path / f"v{trial}")
        assert got["reward"] == swe_testlib.host_pytest_fraction(repo, task_row["hidden_tests"], tmp_path), source
    finally:
      await env.close()

  trio.run(main)


async def _episode(manager, chain, row):
  env = await manager.acquire("swe", chain)
  await env.reset(row)
  return env


def test_hostile_commands_are_contained_and_the_server_serves_on(server, task_row, tmp_path):
  outside = tmp_path / "escaped.txt"
  hidden_file = os.path.join(task_row["hidden_tests"], "test_hidden.py")
  port = server.address.rsplit(":", 1)[1]
  hostile = {
    "fork bomb": ":(){ :|:& };:; sleep 1; echo spawned",
    "network": (
      f"python -c \"import socket; s = socket.socket(); s.settimeout(2); "
      f"s.connect(('127.0.0.1', {port})); print('CONNECTED')\"; "
      f"python -c \"import socket; socket.getaddrinfo('example.com', 80); print('RESOLVED')\""
    ),
    "read hidden tests": (
      f"cat {hidden_file} /hidden_tests/test_hidden.py; "
      "find / -path /proc -prune -o -path /usr -prune -o -path /opt/site-packages -prune "
      "-o -name 'test_hidden*' -print"
    ),
    "write outside the repo": (
      f"echo x > {outside}; echo x > /usr/evil; echo x > /evil; echo x > /opt/site-packages/evil; echo x > /etc/evil"
    ),
    "fill the disk": (
      "for i in $(seq 1 10); do head -c 7000000 /dev/zero > /repo/f$i || break; "
      "done; head -c 20000000 /dev/zero > /tmp/big; df -k /repo /tmp"
    ),
    "sleep past the cap": "sleep 60; echo woke",
  }

  async def main():
    manager = EnvManager([server.address])
    try:
      for i, (name, command) in enumerate(hostile.items()):
        env = await _episode(manager, f"hostile-{i}", task_row)
        started = time.monotonic()
        out = await env.step({"action": "bash", "command": command})
        took = time.monotonic() - started
        text = out.observation
        print(f"{name}: {took:.2f} s: {text[-300:]!r}")
        after = await env.step({"action": "bash", "command": "echo alive; ls /proc | grep -c '^[0-9]'"})
        assert after.observation.startswith("alive\n"), (name, after)
        assert int(after.observation.split()[1]) <= 4, (name, after)  # driver, bash, ls, grep
        if name == "fork bomb":
          assert "spawned" not in text or took < 6
        if name == "network":
          assert "CONNECTED" not in text and "RESOLVED" not in text, text
        if name == "read hidden tests":
          assert "def test_add_small" not in text and "No such file" in text, text
        if name == "write outside the repo":
          assert text.count("Read-only file system") + text.count("No such file") == 5, text
          assert not outside.exists()
        if name == "fill the disk":
          assert "No space left on device" in text or "File too large" in text, text
        if name == "sleep past the cap":
          assert "ran past its 3 s time limit and was killed" in text and took < 8, text
          assert "woke" not in text
        if name in ("fork bomb", "fill the disk"):  # grading still works after them
          graded = await env.compute_reward("hidden_tests")
          assert graded["total"] == 4.0 and graded["reward"] == 0.5, (name, graded)
        await manager.release("swe", f"hostile-{i}")
      stats = (await server_stats(server.address))["pools"]["swe"]
      assert stats["crashes"] == 0 and stats["timeouts"] == 0
    finally:
      await manager.aclose()

  trio.run(main)
  assert server.process.poll() is None


def test_two_episodes_never_see_each_others_edits(server, task_row):
  async def main():
    manager = EnvManager([server.address])
    try:
      a = await _episode(manager, "iso-a", task_row)
      b = await _episode(manager, "iso-b", task_row)
      await a.step({"action": "str_replace", "path": "pkg/m.py", "old": "a - b", "new": "a + b"})
      await a.step({"action": "bash", "command": "echo secret > /tmp/note; echo x > /repo/new.txt"})
      seen = await b.step({"action": "bash", "command": "grep -c 'a - b' pkg/m.py; ls /tmp /repo; cat /tmp/note"})
      assert seen.observation.startswith("1\n") and "new.txt" not in seen.observation
      assert "No such file" in seen.observation
      assert (await a.compute_reward("hidden_tests"))["reward"] == 1.0
      assert (await b.compute_reward("hidden_tests"))["reward"] == 0.5
      await manager.release("swe", "iso-a")
      c = await _episode(manager, "iso-c", task_row)  # may get a's pool slot: a fresh copy
      seen = await c.step({"action": "bash", "command": "grep -c 'a - b' pkg/m.py; ls /repo"})
      assert seen.observation.startswith("1\n") and "new.txt" not in seen.observation
    finally:
      await manager.aclose()

  trio.run(main)


def test_a_crashed_sandbox_is_an_error_observation_and_is_recycled(server, task_row):
  async def main():
    manager = EnvManager([server.address])
    try:
      env = await _episode(manager, "crash", task_row)
      before = (await server_stats(server.address))["pools"]["swe"]["recycled"]
      kill(env.info["worker_pid"])
      # the step must come after the death (a step racing the SIGKILL can still be answered)
      await wait_until(lambda: process_ended(env.info["worker_pid"]), timeout_s=10)
      out = await env.step({"action": "bash", "command": "echo hi"})
      assert out.info.get("error") == "EnvCrashed" and "died" in out.observation, out
      after = (await server_stats(server.address))["pools"]["swe"]
      assert after["recycled"] == before + 1 and after["crashes"] >= 1
      out = await env.step({"action": "bash", "command": "echo hi"})  # a fresh, empty sandbox
      assert out.done and out.info["error"] == "NoTask"
      assert (await env.reset(task_row)).startswith("add() subtracts.")  # the chain goes on
      out = await env.step({"action": "bash", "command": "echo hi"})
      assert out.observation == "hi\n"
    finally:
      await manager.aclose()

  trio.run(main)


def test_a_sandbox_outlives_the_thread_that_started_it():
  """With --as-pid-1, bwrap's --die-with-parent watches the forking thread; trio forks from
  worker threads that exit when idle. A sandbox started from a thread that then ends must keep
  serving."""
  import json
  import struct
  import subprocess
  import threading

  env = SweEnv()
  started = {}

  def spawn():
    started["process"] = subprocess.Popen(
      env._sandbox().command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )

  thread = threading.Thread(target=spawn)
  thread.start()
  thread.join()
  process = started["process"]
  try:
    time.sleep(0.5)
    assert process.poll() is None
    body = json.dumps({"op": "ping"}).encode()
    process.stdin.write(struct.pack(">I", len(body)) + body)
    process.stdin.flush()
    replies = [process.stdout.read(struct.unpack(">I", process.stdout.read(4))[0]) for _ in range(2)]
    assert json.loads(replies[0])["ready"] and json.loads(replies[1]) == {"pong": True}
  finally:
    process.kill()
    process.wait()


def test_a_hanging_hidden_test_fails_alone(task_row):
  """The agent's code loops forever in one function: that hidden test fails at the per-test
  limit, the others are still graded."""

  async def main():
    env = SweEnv(test_timeout_s=2)
    await env.start()
    try:
      await env.reset(task_row)
      await env.step(
        {"action": "str_replace", "path": "pkg/m.py", "old": "  return x / 2", "new": "  while True:\n    pass"}
      )
      await env.step({"action": "str_replace", "path": "pkg/m.py", "old": "a - b", "new": "a + b"})
      started = time.monotonic()
      result = await env.grade()
      assert time.monotonic() - started < 20
      outcomes = dict(result["cases"])
      assert result["passed"] == 3 and result["total"] == 4, result
      assert [name for name, outcome in outcomes.items() if outcome != "passed"] == ["test_hidden::test_half"], outcomes
    finally:
      await env.close()

  trio.run(main)
