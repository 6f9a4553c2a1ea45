"""The Harbor task (agentfly_jax/tasks/harbor.py, configs/harbor_grpo.py): the shipped example
tasks as rows, and a user's rows whose task directory lacks tests/test.sh or needs its own
container image stop the run before training, naming the row, the task and the field."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest

from agentfly_jax.tasks.from_config import build_task
from envservers.envs import harbor_tasks


def _config(**task_fields):
  spec = importlib.util.spec_from_file_location("harbor_grpo", "configs/harbor_grpo.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.task.update(task_fields)
  return c


def test_shipped_rows_and_bad_task_dirs_stop_before_training(tmp_path):
  task = build_task(_config())
  rows = task.make_rows(len(harbor_tasks.shipped_task_dirs()), seed=0)
  assert {r["harbor_task"] for r in rows} == set(harbor_tasks.shipped_task_dirs())
  assert [t.name for t in task.tools] == ["bash", "view", "str_replace", "submit"]
  good = harbor_tasks.shipped_task_dirs()[0]
  broken = tmp_path / "broken-task"
  shutil.copytree(good, broken)
  os.remove(broken / "tests" / "test.sh")
  imaged = tmp_path / "imaged-task"
  shutil.copytree(good, imaged)
  (imaged / "task.toml").write_text('[environment]\ndocker_image = "alpine:3"\n')
  for bad, named in ((broken, r"row 1: .*'broken-task'.*tests/test\.sh"), (imaged, r"'imaged-task'.*docker_image")):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"question": "q", "harbor_task": p}) for p in (good, str(bad))))
    with pytest.raises(ValueError, match=named):
      build_task(_config(train_path=str(rows)))
