"""The shipped SWE task set: splits by repository, bug kinds, the generator reproduces it, the
scripted expert solves every test task through a real env server and a random policy does not;
bring-your-own rows are checked before training, each bad row named with its field."""

from __future__ import annotations

import ast
import filecmp
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from envservers.envs import swe_policies, swe_rows, swe_tasks
from envservers.envs.swe import SweEnv
from tests import swe_testlib
from envservers_helpers import running_server, sandbox_unavailable_reason
from train_cli import load_script
from worlds_helpers import play

needs_sandbox = pytest.mark.skipif(sandbox_unavailable_reason() is not None, reason=str(sandbox_unavailable_reason()))
pytestmark = pytest.mark.timeout(600)


def _make_swe_tasks():
  """experiments/make_swe_tasks.py as a module (a script, not part of the package)."""
  return load_script("experiments/make_swe_tasks.py")


def _test_functions(path: str) -> set[str]:
  with open(path) as f:
    return {n.name for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)}


def test_shipped_set_splits_by_repository_and_covers_every_bug_kind():
  KINDS = _make_swe_tasks().KINDS
  metas = {
    split: [swe_tasks.shipped_task_meta(t) for t in swe_tasks.shipped_task_ids(split)] for split in swe_tasks.SPLITS
  }
  assert len(metas["train"]) >= 25 and len(metas["dev"]) >= 7 and len(metas["test"]) >= 15
  repos = {split: {m["repo_name"] for m in ms} for split, ms in metas.items()}
  assert len(repos["train"]) >= 3 and len(repos["dev"]) >= 1 and len(repos["test"]) >= 3
  assert not (repos["train"] & repos["test"] or repos["train"] & repos["dev"] or repos["dev"] & repos["test"])
  assert {m["kind"] for ms in metas.values() for m in ms} == set(KINDS)
  for split in swe_tasks.SPLITS:  # a task is one file; each repository is shipped once
    assert all(n.endswith(".json") for n in os.listdir(os.path.join(swe_tasks.SHIPPED_DIR, split)))
    assert sorted(os.listdir(os.path.join(swe_tasks.REPOS_DIR, split))) == sorted(repos[split])
  for meta in metas["train"] + metas["dev"] + metas["test"]:
    task = swe_tasks.resolve_row({"task_id": meta["task_id"]})
    assert task.selected_tests == tuple(meta["fail_to_pass"]) and task.selected_tests
    for node in task.selected_tests:  # each names a hidden test function
      module, name = node.split("::")
      assert name in _test_functions(os.path.join(task.hidden_tests, module)), node
    files = [f for _, _, fs in os.walk(task.repo) for f in fs if f.endswith(".py")]
    assert 3 <= len([f for f in files if not f.startswith("test_") and f != "__init__.py"]) + 1 <= 7
    with open(os.path.join(task.repo, task.bug.path)) as f:
      clean = f.read()
    buggy = task.bug.apply(clean)  # the bug and the reference fix are each one exact edit
    fix = swe_tasks.reference_fix(meta)
    assert buggy != clean and buggy.count(fix["old"]) == 1
    assert buggy.replace(fix["old"], fix["new"]) == clean
    assert "test_hidden" not in os.listdir(task.repo)
  with pytest.raises(ValueError, match="field 'task_id'"):
    swe_tasks.resolve_row({"task_id": "nope-0"})


def test_generator_reproduces_the_shipped_tasks_of_a_repository(tmp_path):
  """One repository through the generator again: byte-identical task files."""
  make_swe_tasks = _make_swe_tasks()
  files, hidden = make_swe_tasks.source_repos("test")["units"]
  made = make_swe_tasks.make_repo_tasks("units", files, hidden, str(tmp_path), 2, make_swe_tasks.repo_rng(0, "units"))
  assert sorted(made) == [t for t in swe_tasks.shipped_task_ids("test") if t.startswith("units-")]
  assert sorted(os.listdir(tmp_path)) == sorted(f"{t}.json" for t in made)
  for task_id in made:
    assert filecmp.cmp(tmp_path / f"{task_id}.json", swe_tasks.shipped_task_path(task_id), shallow=False), task_id


@needs_sandbox
def test_episode_repository_carries_the_bug_and_grading_runs_its_tests():
  """A shipped task's episode: the clean repository with the bug made (and nothing else
  changed); grading runs exactly the task's fail_to_pass tests (0 pass before the fix, all
  after)."""
  task_id = "units-wrong_operator-0"
  task = swe_tasks.resolve_row({"task_id": task_id})

  async def main():
    env = SweEnv()
    await env.start()
    try:
      await env.reset({"task_id": task_id})
      listing = await env.step({"action": "bash", "command": "find . -name '*.py' | sort | xargs md5sum"})
      before = await env.grade()
      fix = swe_tasks.reference_fix(swe_tasks.shipped_task_meta(task_id))
      await env.step({"action": "str_replace", **fix})
      after = await env.grade()
      return listing.observation, before, after
    finally:
      await env.close()

  listing, before, after = trio.run(main)
  expected = {}
  for root, _, names in os.walk(task.repo):
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(root, name)
        rel = "./" + os.path.relpath(path, task.repo)
        with open(path) as f:
          text = f.read()
        text = task.bug.apply(text) if rel == "./" + task.bug.path else text
        expected[rel] = hashlib.md5(text.encode()).hexdigest()
  assert {line.split()[1]: line.split()[0] for line in listing.splitlines()} == expected
  names = sorted(case.rsplit("::", 1)[1] for case, _ in before["cases"])
  assert names == sorted(node.split("::")[1] for node in task.selected_tests)
  assert (before["passed"], before["total"]) == (0, len(task.selected_tests))
  assert after["passed"] == after["total"] == len(task.selected_tests)


def _one_per_repository(split: str) -> list[str]:
  firsts = {}
  for task_id in swe_tasks.shipped_task_ids(split):
    firsts.setdefault(swe_tasks.shipped_task_meta(task_id)["repo_name"], task_id)
  return sorted(firsts.values())


@needs_sandbox
@pytest.mark.parametrize("which", [pytest.param("one_per_repository"), pytest.param("all", marks=pytest.mark.slow)])
def test_expert_solves_every_test_task_and_random_scores_near_zero(which):
  task_ids = swe_tasks.shipped_task_ids("test") if which == "all" else _one_per_repository("test")
  rng = np.random.default_rng(0)

  async def main():
    expert_rewards, random_rewards = {}, {}
    with running_server("swe=4:2") as server:
      manager = EnvManager([server.address])

      async def solve(task_id):
        expert = swe_policies.ScriptedExpert(swe_tasks.shipped_task_meta(task_id))

        async def act(observation, env):
          return expert.act(observation)

        result = await play(manager, "swe", {"task_id": task_id}, act, 8, "hidden_tests")
        assert result["done"] and result["submitted"] == 1.0, (task_id, result)
        assert result["total"] == len(swe_tasks.resolve_row({"task_id": task_id}).selected_tests)
        assert expert.location is not None and expert.location[0].endswith(".py")
        expert_rewards[task_id] = result["reward"]
        files = swe_policies.repo_files(swe_tasks.resolve_row({"task_id": task_id}))
        steps = iter(range(100))

        async def random_act(observation, env):
          return swe_policies.random_action(rng, files, next(steps))

        random_rewards[task_id] = (await play(manager, "swe", {"task_id": task_id}, random_act, 10, "hidden_tests"))[
          "reward"
        ]

      async with trio.open_nursery() as nursery:
        limiter = trio.CapacityLimiter(2)
        for task_id in task_ids:

          async def one(task_id=task_id):
            async with limiter:
              await solve(task_id)

          nursery.start_soon(one)
      await manager.aclose()
    return expert_rewards, random_rewards

  expert_rewards, random_rewards = trio.run(main)
  print(
    f"swe test split: expert {np.mean(list(expert_rewards.values())):.3f}, random "
    f"{np.mean(list(random_rewards.values())):.3f} over {len(task_ids)} tasks"
  )
  assert expert_rewards == {t: 1.0 for t in task_ids}
  assert np.mean(list(random_rewards.values())) < 0.1


@needs_sandbox
def test_bad_rows_stop_with_the_row_and_field_named(tmp_path):
  good = swe_testlib.make_task(tmp_path / "good")
  fixed = swe_testlib.make_task(tmp_path / "fixed")
  with open(os.path.join(fixed["repo"], "pkg", "m.py"), "w") as f:
    f.write(swe_testlib.BUGGY_MODULE.replace("a - b", "a + b"))
  no_tests = swe_testlib.make_task(tmp_path / "no_tests")
  shutil.rmtree(os.path.join(no_tests["hidden_tests"]))
  os.makedirs(no_tests["hidden_tests"])
  cases = [
    ({**good, "repo": str(tmp_path / "missing")}, "field 'repo': folder .* does not exist"),
    ({**good, "repo": "relative/path"}, "field 'repo' must be an absolute path"),
    ({**good, "test_command": "no_such_tool --run"}, "field 'test_command'.*command was not found"),
    (
      {**good, "test_command": "python -m pytest -q no_tests_here"},
      "field 'test_command'.*usage error|field 'test_command'.*no tests",
    ),
    (fixed, "field 'hidden_tests': all 4 hidden tests already pass"),
    (no_tests, "field 'hidden_tests': .* has no test functions"),
    ({k: v for k, v in good.items() if k != "problem_statement"}, "field 'problem_statement'"),
  ]
  for i, (bad, message) in enumerate(cases):
    rows = [good, bad] if i == 0 else [bad]  # the row's index is named
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match=f"rows.jsonl row {len(rows) - 1}: {message}"):
      swe_rows.load_swe_rows(str(path))
  checked = swe_rows.load_swe_rows(_write(tmp_path, [good]))
  assert checked == [{**good, "question": "add() subtracts."}]
  with pytest.raises(ValueError, match="line 2: not valid JSON"):
    swe_rows.read_rows(_write(tmp_path, None, text=json.dumps(good) + "\n{oops\n"))


def _write(tmp_path, rows, text=None) -> str:
  path = tmp_path / "rows_file.jsonl"
  path.write_text(text if text is not None else "\n".join(json.dumps(r) for r in rows) + "\n")
  return str(path)
