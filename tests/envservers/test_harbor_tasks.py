"""Harbor-format task directories on the swe env: the loader's errors (no tests/test.sh, a task
needing its own image: named with the task and the field), and the shipped example tasks through
a real env server: untouched -> low reward, the reference solution -> 1.0, tests/ and solution/
absent from the agent's sandbox, a bad row named while the server serves on."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from envservers.envs import harbor_tasks
from envservers_helpers import running_server, sandbox_unavailable_reason

needs_sandbox = pytest.mark.skipif(sandbox_unavailable_reason() is not None, reason=str(sandbox_unavailable_reason()))
OPTIONS = ("swe.repo_mb=16", "swe.tmp_mb=16", "swe.memory_cgroup=false")


def _copy_task(tmp_path, name="fix-word-count"):
  path = tmp_path / name
  shutil.copytree(os.path.join(harbor_tasks.SHIPPED_DIR, name), path)
  return path


def test_loader_reads_shipped_tasks_and_names_what_is_wrong(tmp_path):
  dirs = harbor_tasks.shipped_task_dirs()
  assert [os.path.basename(d) for d in dirs] == ["csv-column-sum", "fix-word-count"]
  task = harbor_tasks.load_task(dirs[1])
  assert task.grader == "harbor" and task.repo.endswith("environment") and "top_words" in task.problem_statement
  no_tests = _copy_task(tmp_path)
  os.remove(no_tests / "tests" / "test.sh")
  with pytest.raises(ValueError, match=r"'fix-word-count'.*tests/test\.sh"):
    harbor_tasks.load_task(str(no_tests))
  image = _copy_task(tmp_path, "csv-column-sum")
  with open(image / "task.toml", "a") as f:
    f.write('\n[environment]\ndocker_image = "ghcr.io/x/y:1"\n')
  with pytest.raises(ValueError, match=r"'csv-column-sum'.*environment\.docker_image"):
    harbor_tasks.load_task(str(image))
  built = tmp_path / "other"
  shutil.copytree(os.path.join(harbor_tasks.SHIPPED_DIR, "csv-column-sum"), built)
  (built / "environment" / "Dockerfile").write_text("FROM python:3.11\n")
  with pytest.raises(ValueError, match=r"'other'.*environment/Dockerfile"):
    harbor_tasks.load_task(str(built))
  with pytest.raises(ValueError, match="does not exist"):
    harbor_tasks.load_task(str(tmp_path / "nowhere"))
  assert harbor_tasks.parse_grade("x\nHARBOR_EXIT=1\nHARBOR_REWARD=") == (0.0, 1)
  assert harbor_tasks.parse_grade("HARBOR_EXIT=0\nHARBOR_REWARD=") == (1.0, 0)
  assert harbor_tasks.parse_grade("HARBOR_EXIT=3\nHARBOR_REWARD=0.75") == (0.75, 3)


@needs_sandbox
@pytest.mark.timeout(240)
def test_shipped_tasks_graded_by_test_sh_through_the_server(tmp_path):
  no_tests = _copy_task(tmp_path)
  os.remove(no_tests / "tests" / "test.sh")

  async def episode(manager, task_dir, solve: bool):
    env = await manager.acquire("swe", f"chain-{os.path.basename(task_dir)}-{solve}")
    opening = await env.reset({"question": "solve", "harbor_task": task_dir})
    listing = await env.step({"action": "bash", "command": "ls -a /repo; ls / ; ls /tests /hidden_tests 2>&1"})
    if solve:
      with open(os.path.join(task_dir, "solution", "solve.sh")) as f:
        await env.step({"action": "bash", "command": f.read()})
    result = await env.step({"action": "submit"})
    await manager.release("swe", f"chain-{os.path.basename(task_dir)}-{solve}")
    return opening, listing.observation, result

  async def main():
    manager = EnvManager([server.address])
    out = {}
    for task_dir in harbor_tasks.shipped_task_dirs():
      for solve in (False, True):
        out[os.path.basename(task_dir), solve] = await episode(manager, task_dir, solve)
    env = await manager.acquire("swe", "bad")
    with pytest.raises(Exception, match=r"tests/test\.sh"):
      await env.reset({"question": "solve", "harbor_task": str(no_tests)})
    await manager.release("swe", "bad")
    out["after"] = await episode(manager, harbor_tasks.shipped_task_dirs()[0], True)
    await manager.aclose()
    return out

  with running_server("swe=2:0", options=OPTIONS) as server:
    out = trio.run(main)
  opening, listing, _ = out["fix-word-count", False]
  assert "top_words" in opening and "wordcount.py" in listing
  assert "test.sh" not in listing and "solve.sh" not in listing and "No such file" in listing
  assert out["fix-word-count", False][2].reward == 0.25  # one of four checks passes unfixed
  assert out["csv-column-sum", False][2].reward == 0.0
  for name in ("fix-word-count", "csv-column-sum"):
    assert out[name, True][2].reward == 1.0 and out[name, True][2].done, out[name, True][2].observation
  assert out["after"][2].reward == 1.0  # the server served on after the bad row


def test_the_task_s_own_timeouts_are_read_and_bad_ones_named(tmp_path):
  task = harbor_tasks.load_task(os.path.join(harbor_tasks.SHIPPED_DIR, "csv-column-sum"))
  assert (task.grade_timeout_s, task.agent_timeout_s) == (60.0, 300.0)
  bad = _copy_task(tmp_path)
  (bad / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n')
  with pytest.raises(ValueError, match=r"'fix-word-count'.*'verifier.timeout_sec' = 'soon': must be a number"):
    harbor_tasks.load_task(str(bad))
  (bad / "task.toml").write_text("agent = 3\n")
  with pytest.raises(ValueError, match=r"task.toml field 'agent' must be a table"):
    harbor_tasks.load_task(str(bad))


@needs_sandbox
@pytest.mark.timeout(240)
def test_the_task_s_verifier_and_agent_timeouts_are_honoured(tmp_path):
  slow_grade = _copy_task(tmp_path, "fix-word-count")
  (slow_grade / "task.toml").write_text("[verifier]\ntimeout_sec = 2.0\n")
  (slow_grade / "tests" / "test.sh").write_text("#!/bin/bash\nsleep 60\necho 1 > /logs/verifier/reward.txt\n")
  short_agent = _copy_task(tmp_path, "csv-column-sum")
  (short_agent / "task.toml").write_text("[agent]\ntimeout_sec = 1.5\n")
  too_long = tmp_path / "too-long"
  shutil.copytree(os.path.join(harbor_tasks.SHIPPED_DIR, "csv-column-sum"), too_long)
  (too_long / "task.toml").write_text("[verifier]\ntimeout_sec = 900\n")

  async def main():
    manager = EnvManager([server.address])
    out = {}
    env = await manager.acquire("swe", "slow-grade")
    await env.reset({"question": "solve", "harbor_task": str(slow_grade)})
    started = time.monotonic()
    out["graded"] = await env.step({"action": "submit"})
    out["grade_s"] = time.monotonic() - started
    await manager.release("swe", "slow-grade")
    env = await manager.acquire("swe", "short-agent")
    await env.reset({"question": "solve", "harbor_task": str(short_agent)})
    out["before"] = await env.step({"action": "bash", "command": "sleep 3; echo late"})
    out["after"] = await env.step({"action": "bash", "command": "echo more"})
    await manager.release("swe", "short-agent")
    env = await manager.acquire("swe", "too-long")
    with pytest.raises(Exception, match=r"timeout_sec = 900 is over this env's grade_timeout_s = 120"):
      await env.reset({"question": "solve", "harbor_task": str(too_long)})
    await manager.release("swe", "too-long")
    await manager.aclose()
    return out

  with running_server("swe=2:0", options=OPTIONS) as server:
    out = trio.run(main)
  assert out["graded"].reward == 0.0 and out["graded"].done  # the 60 s test.sh stopped at the task's 2 s
  assert out["grade_s"] < 30, out["grade_s"]
  assert "late" not in out["before"].observation  # the command ran under what was left of the 1.5 s
  assert out["after"].done and "[agent] timeout_sec = 1.5" in out["after"].observation
  assert out["after"].info.get("agent_timed_out") is True
