"""A user's task from the command line (a JSON dataset + a module with a custom tool and reward):
the task it builds, its fingerprint, and malformed inputs stopping before anything is built with a
message naming what is wrong. Training it through train.py flags and evaluating the run:
tests/e2e/test_golden_run.py."""

import json
import os
import subprocess
import sys
import textwrap

import ml_collections
import pytest
from custom_task_testlib import MODULE, WORDS, env_with as _env, task_flags as _task_flags, write_task as _write_task
from train_cli import ROOT, train_command

from agentfly_jax.rl.config import default_config
from agentfly_jax.tasks.from_config import build_task, custom_task_config, set_custom_task, task_fingerprint


def _config(**task):
  return set_custom_task(default_config(), **task)


@pytest.fixture()
def user_task(tmp_path, monkeypatch):
  folder = tmp_path / "user"
  _write_task(folder)
  monkeypatch.syspath_prepend(str(folder))
  sys.modules.pop("mirror_task", None)
  yield folder
  sys.modules.pop("mirror_task", None)


def test_module_and_rows_make_the_task(user_task):
  task = build_task(
    _config(module="mirror_task", train_path=str(user_task / "train.json"), eval_path=str(user_task / "eval.jsonl"))
  )
  assert [t.name for t in task.tools] == ["mirror_word"] and task.reward.name == "mirror_match"
  assert len(task.rows) == 8 and len(task.make_eval_rows(10, 0)) == 4
  assert task.system_prompt.startswith("Spell words") and task.scripted_response is not None
  # names: a built-in tool next to the module's, a built-in reward over the same rows
  rows = [{"question": "q", "answer": "4"}]
  (user_task / "plain.json").write_text(json.dumps(rows))
  task = build_task(
    _config(train_path=str(user_task / "plain.json"), tools="calculator,mirror_task:mirror_word", reward="exact_match")
  )
  assert [t.name for t in task.tools] == ["calculator", "mirror_word"] and task.reward.name == "exact_match"
  # a full task module (the lookup demo: TOOLS, REWARD, make_rows, a demo policy, its own agent)
  # read by the same from_module as the built-in: its generators stay generators (rows drawn per seed)
  lookup = build_task(_config(module="agentfly_jax.tasks.lookup"))
  builtin = build_task(default_config())
  assert [t.name for t in lookup.tools] == ["lookup"] and lookup.rows == () and lookup.generate_rows is not None
  assert lookup.scripted_response is not None and lookup.agent_factory is not None
  for split in ("train", "dev", "test"):
    assert lookup.split_rows(split, 6, seed=5) == builtin.split_rows(split, 6, seed=5)
    assert lookup.split_rows(split, 6, seed=5) != lookup.split_rows(split, 6, seed=6)


def test_fingerprint_covers_rows_tools_reward_and_demo(user_task):
  base = dict(module="mirror_task", train_path=str(user_task / "train.json"))
  fp = task_fingerprint(build_task(_config(**base)))
  assert fp == task_fingerprint(build_task(_config(**base)))
  rows = json.loads((user_task / "train.json").read_text())
  (user_task / "train2.json").write_text(json.dumps(rows[:-1]))
  assert task_fingerprint(build_task(_config(**{**base, "train_path": str(user_task / "train2.json")}))) != fp
  assert task_fingerprint(build_task(_config(**base, tools="mirror_word,calculator"))) != fp
  (user_task / "other.py").write_text(
    MODULE.replace("float(mirrored in", "0.5 * float(mirrored in").replace("I do not know.", "No idea.")
  )
  other = build_task(_config(module="other", train_path=str(user_task / "train.json")))
  assert task_fingerprint(other) != fp


BAD_CASES = {
  # name: (files to write {name: text}, task fields, extra flags, message parts)
  "row without question": (
    {"rows.json": '[{"question": "a", "mirrored": "a"}, {"mirrored": "b"}]'},
    {"train_path": "rows.json"},
    [],
    ["rows.json: row 1", "no field 'question'"],
  ),
  "reward field no row has": (
    {"rows.jsonl": '{"question": "a"}\n{"question": "b"}\n'},
    {"train_path": "rows.jsonl"},
    [],
    ["reward 'mirror_match' reads field 'mirrored'", "no row of", "rows.jsonl"],
  ),
  "unknown tool": ({}, {"tools": "mirror_word,no_such_tool"}, [], ["config.task.tools", "unknown tool 'no_such_tool'"]),
  "module does not import": (
    {"broken_task.py": "import not_a_real_package_xyz\n"},
    {"module": "broken_task"},
    [],
    ["config.task.module='broken_task'", "does not import", "not_a_real_package_xyz"],
  ),
  "JSON does not parse": (
    {"rows.json": '[\n {"question": "a", "mirrored": "a"},\n {"question": "b" "x"}\n]'},
    {"train_path": "rows.json"},
    [],
    ["rows.json", "not valid JSON", "line 3"],
  ),
  "JSONL line does not parse": (
    {"rows.jsonl": '{"question": "a", "mirrored": "a"}\n{"question": \n'},
    {"train_path": "rows.jsonl"},
    [],
    ["rows.jsonl: line 2 is not valid JSON"],
  ),
  "sft without demo policy": (
    {"nodemo.py": MODULE.replace("def scripted_response", "def _unused")},
    {"module": "nodemo"},
    ["--config.sft.steps=3"],
    ["config.sft.steps=3", "demonstration policy"],
  ),
}


def _bad_case(folder, name):
  files, fields, flags, parts = BAD_CASES[name]
  for fname, text in files.items():
    (folder / fname).write_text(text)
  fields = {"module": "mirror_task", "train_path": "train.json", **fields}
  return {k: str(folder / v) if k.endswith("_path") else v for k, v in fields.items()}, flags, parts


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_malformed_input_is_named(user_task, name):
  fields, flags, parts = _bad_case(user_task, name)
  config = _config(**fields)
  for flag in flags:
    key, value = flag[len("--config.") :].split("=")
    section, field = key.split(".")
    config[section][field] = int(value)
  with pytest.raises(ValueError) as info:
    build_task(config)
  for part in parts:
    assert part in str(info.value)


@pytest.mark.parametrize("name", ["row without question", "sft without demo policy", "module does not import"])
def test_train_script_stops_before_building(user_task, tmp_path, name):
  fields, flags, parts = _bad_case(user_task, name)
  workdir = tmp_path / "run"
  cmd = train_command(
    workdir, *[f"--config.task.{k}={v}" for k, v in fields.items()], *flags, config="configs/custom_grpo.py"
  )
  out = subprocess.run(cmd, cwd=ROOT, env=_env(user_task), capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  for part in parts:
    assert part in out.stderr, out.stderr[-2000:]
  assert not workdir.exists()  # nothing was built


def test_builtin_task_name_still_works():
  c = default_config()
  assert build_task(c).source.__name__ == "agentfly_jax.tasks.lookup"
  c.task = "nope"
  with pytest.raises(ValueError, match="config.task='nope'"):
    build_task(c)
  assert isinstance(custom_task_config(), ml_collections.ConfigDict)


def test_sweep_rebuilds_a_saved_runs_task_and_checks_points(user_task, tmp_path):
  """sweep.py around a saved run (configs/from_run.py:<run>): every point's task is checked before
  anything runs, and the planned train.py commands carry that run's config."""
  run = tmp_path / "saved_run"
  run.mkdir()
  config = _config(module="mirror_task", train_path=str(user_task / "train.json"))
  (run / "config.json").write_text(config.to_json())
  sweep = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), f"--config=configs/from_run.py:{run}"]
  ok = subprocess.run(
    [*sweep, f"--sweep_dir={tmp_path / 's1'}", "--grid=train.lr=1e-4,3e-4", "--dry_run"],
    cwd=ROOT,
    env=_env(user_task),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert ok.returncode == 0, ok.stderr[-2000:]
  plan = json.loads((tmp_path / "s1" / "plan.json").read_text())
  assert len(plan) == 2 and all(f"from_run.py:{run}" in " ".join(p["cmd"]) for p in plan)
  bad = subprocess.run(
    [
      *sweep,
      f"--sweep_dir={tmp_path / 's2'}",
      "--grid=task.tools=mirror_word;train.lr=1e-4",
      "--base=task.reward=no_such_reward",
      "--dry_run",
    ],
    cwd=ROOT,
    env=_env(user_task),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert bad.returncode != 0 and "unknown reward 'no_such_reward'" in bad.stderr, bad.stderr[-2000:]
  assert not (tmp_path / "s2" / "plan.json").exists()
