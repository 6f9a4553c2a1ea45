"""The code task's pass-rate reward in the real bubblewrap sandbox (correct, wrong, hostile and
syntax-error submissions), and the generated math and code task sets."""

from __future__ import annotations

import inspect
import random
import time

import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.rewards import get_reward, math_equal
from agentfly_jax.rewards.code import code_pass_rate, extract_code, run_hidden_tests
from agentfly_jax.tasks import code_tasks, get_task, math_calc
from envservers_helpers import running_server, sandbox_unavailable_reason

pytestmark = pytest.mark.timeout(300)

SECRET = "hidden-7f3a91"
TESTS = [{"args": [i, f"k{i}"], "expected": f"{SECRET}-{i}"} for i in range(4)]

_READ_EVERYTHING = f'''
import glob, os, re, sys
def solve(i, key):
  paths = [{inspect.getsourcefile(code_tasks)!r}, {__file__!r}]
  for pattern in ("/proc/*/cmdline", "/proc/*/environ", "/proc/*/fd/*", "/workspace/**",
                  "/tmp/**"):
    paths += [p for p in glob.glob(pattern, recursive=True)   # not its own pipes (reads block)
              if not p.startswith((f"/proc/{{os.getpid()}}/", "/proc/self/", "/proc/thread-self/"))]
  for path in paths:
    try:
      with open(path, "rb") as f:
        data = f.read(1 << 22)
    except Exception as e:
      sys.stderr.write(f"{{path}}: {{type(e).__name__}}\\n")
      continue
    m = re.search(rb"hidden-7f3a91-" + str(i).encode(), data)
    if m:
      return m.group().decode()
  for maps in glob.glob("/proc/*/maps"):   # other processes' memory (the harness holds it)
    pid = maps.split("/")[2]
    if pid in ("self", "thread-self", str(os.getpid())):   # its own memory holds the needle
      continue
    try:
      with open(maps) as f, open(f"/proc/{{pid}}/mem", "rb") as mem:
        for line in f:
          lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
          if "r" not in line.split()[1] or hi - lo > 1 << 22:
            continue
          try:
            mem.seek(lo)
            m = re.search(rb"hidden-7f3a91-" + str(i).encode(), mem.read(hi - lo))
          except OSError:
            continue
          if m:
            return m.group().decode()
    except Exception as e:
      sys.stderr.write(f"mem {{pid}}: {{type(e).__name__}}\\n")
  return None
'''

SUBMISSIONS = {
  "correct": (f"def solve(i, key):\n  return '{SECRET}-' + str(i)\n", 1.0, None),
  "half": (f"def solve(i, key):\n  return '{SECRET}-' + str(i) if i % 2 else 'no'\n", 0.5, None),
  "wrong": ("def solve(i, key):\n  return key\n", 0.0, None),
  "syntax_error": ("def solve(i, key)\n  return key\n", 0.0, "SyntaxError"),
  "missing_function": ("def other():\n  pass\n", 0.0, "KeyError"),
  "infinite_loop": (
    "def solve(i, key):\n  while True:\n    try:\n      pass\n    except BaseException:\n      pass\n",
    0.0,
    "Timeout",
  ),
  "crash": ("import os\ndef solve(i, key):\n  os._exit(3)\n", 0.0, "exit status 3"),
  "segfault": ("import ctypes\ndef solve(i, key):\n  return ctypes.string_at(0)\n", 0.0, "exit status -11"),
  "fork_bomb": ("import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n", 0.0, "Timeout"),
  "fake_report": (
    "import json, os\ndef solve(i, key):\n"
    "  for fd in range(1, 64):\n"
    "    try:\n      os.write(fd, b'{\"passed\": 4, \"total\": 4}\\n')\n"
    "    except OSError:\n      pass\n  return None\n",
    0.0,
    None,
  ),
  "reads_hidden_tests": (_READ_EVERYTHING, 0.0, None),
}


@pytest.fixture(scope="module")
def sandbox_server():
  reason = sandbox_unavailable_reason()
  if reason:
    pytest.skip(reason)
  with running_server("python_sandbox=6:2") as server:
    yield server


def test_code_reward_on_correct_wrong_hostile_and_broken_submissions(sandbox_server):
  manager = EnvManager([sandbox_server.address])
  reports = {}

  async def one(name, code):
    env = await manager.acquire("python_sandbox", name)
    try:
      await env.step("import os; os.environ['TAMPER'] = '1'")  # earlier tool calls: reset away
      start = time.monotonic()
      reports[name] = await run_hidden_tests(code, "solve", TESTS, env, timeout_s=6.0)
      reports[name]["seconds"] = time.monotonic() - start
    finally:
      await manager.release("python_sandbox", name)

  async def main():
    async with trio.open_nursery() as nursery:
      for name, (code, _, _) in SUBMISSIONS.items():
        nursery.start_soon(one, name, code)

  trio.run(main)
  for name, (_, expected, error) in SUBMISSIONS.items():
    report = reports[name]
    assert report["reward"] == expected, (name, report)
    assert report["total"] == len(TESTS)
    assert report["seconds"] < 40, (name, report)  # bounded: never hangs the step
    if error:
      assert error in (report["error"] or ""), (name, report)
  assert SECRET not in reports["reads_hidden_tests"]["stderr"]
  assert (
    "PermissionError" in reports["reads_hidden_tests"]["stderr"]
    or "FileNotFoundError" in reports["reads_hidden_tests"]["stderr"]
  )


def test_code_pass_rate_as_a_rollout_reward_and_on_task_rows(sandbox_server):
  manager = EnvManager([sandbox_server.address])
  rows = code_tasks.make_eval_rows(len(code_tasks.FAMILIES) * 2, seed=0)
  assert {r["family"] for r in rows} & set(code_tasks.TEST_FAMILIES)

  async def main():
    results = []
    for i, row in enumerate(rows[:6]):
      env = await manager.acquire("python_sandbox", f"row{i}")
      try:
        good = f"Here it is:\n```python\n{code_tasks.reference_source(row['family'])}```"
        results.append(await code_pass_rate.compute(good, [], row, env=env))
        results.append(await code_pass_rate.compute("def nope(): pass", [], row, env=env))
      finally:
        await manager.release("python_sandbox", f"row{i}")
    return results

  results = trio.run(main)
  assert [r["reward"] for r in results[0::2]] == [1.0] * 6
  assert [r["reward"] for r in results[1::2]] == [0.0] * 6
  assert get_reward("code_pass_rate") is code_pass_rate


def test_extract_code_and_bad_test_rows():
  assert extract_code("text\n```python\na = 1\n```\nmore\n```py\nb = 2\n```") == "b = 2\n"
  assert extract_code("x = 3") == "x = 3"
  with pytest.raises(ValueError, match="entry_point"):
    trio.run(run_hidden_tests, "x", "not a name", TESTS)
  with pytest.raises(ValueError, match=r"tests\[1\]"):
    trio.run(run_hidden_tests, "x", "f", [{"args": [], "expected": 1}, {"args": 3}])


def test_code_task_rows_match_their_reference_solutions():
  for family, (_, entry, reference, _) in code_tasks.FAMILIES.items():
    namespace = {}
    exec(code_tasks.reference_source(family), namespace)
    row = code_tasks.make_problem(family, random.Random(5), num_tests=20)
    assert row["entry_point"] == entry and entry in row["question"]
    for t in row["tests"]:
      assert namespace[entry](*t["args"]) == t["expected"], (family, t)
  train = code_tasks.make_rows(200, seed=0)
  assert not {r["family"] for r in train} & set(code_tasks.TEST_FAMILIES)


def test_math_task_rows_are_computed_right_and_split():
  train, test = math_calc.make_rows(600, seed=0), math_calc.make_eval_rows(300, seed=0)
  assert {r["kind"] for r in train} == set(math_calc.KINDS) == {r["kind"] for r in test}
  assert not {r["question"] for r in train} & {r["question"] for r in test}
  assert all(math_calc.is_test_question(r["question"]) for r in test)
  assert math_calc.make_rows(50, seed=3) == math_calc.make_rows(50, seed=3)
  import re

  for row in train:  # independent recomputation of a few kinds from the question text
    nums = [int(x.replace(",", "")) for x in re.findall(r"\d[\d,]*", row["question"])]
    if row["kind"] == "product":
      assert int(row["answer"]) == nums[0] * nums[1]
    elif row["kind"] == "modpow":
      assert int(row["answer"]) == pow(nums[0], nums[1], nums[2])
    elif row["kind"] == "binomial":
      from math import comb

      assert int(row["answer"]) == comb(nums[1], nums[0])
    elif row["kind"] == "volume":
      assert float(row["answer"]) == pytest.approx(nums[0] * nums[1] * nums[2] / 1000)
    assert math_equal(row["answer"], row["answer"]) == 1.0
  assert get_task("math_calc") is math_calc and get_task("code") is code_tasks
