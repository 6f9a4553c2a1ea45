"""Scripted bounds for the `swe` env: an expert that fixes a shipped task and a random policy.

The expert acts as a developer would with the reference fix in mind: it runs the tests, reads
the failing traceback for the first repository file (not a test) it names, views that file
around the line, applies the task's fix with one exact `str_replace`, runs the tests again and
submits. The random policy issues uniformly drawn actions (shell commands, views, edits that swap
one line of a file for another) and submits after `max_steps`.
"""

from __future__ import annotations

import os
import re

import numpy as np

from envservers.envs import swe_tasks

# `File "/repo/pkg/mod.py", line 12` (Python tracebacks) or `pkg/mod.py:12:` (pytest's short form).
_LOCATION = re.compile(r'(?:File "/repo/([\w./-]+\.py)", line (\d+))|(?:^|\s)([\w./-]+\.py):(\d+)', re.M)
SHELL_COMMANDS = (
  "ls -R",
  "python -m pytest -q",
  "git status",
  "cat README.md",
  "pwd",
  "python -c 'print(1)'",
  "find . -name '*.py'",
  "head -n 5 tests/*.py",
)


def traceback_location(output: str) -> tuple[str, int] | None:
  """The last (path, line) a traceback in `output` names outside tests/ and site-packages."""
  found = None
  for match in _LOCATION.finditer(output):
    path = match.group(1) or match.group(3)
    line = int(match.group(2) or match.group(4))
    if path.startswith(("tests/", "/")) or "site-packages" in path or "/_pytest/" in path:
      continue
    found = (path, line)
  return found


class ScriptedExpert:
  """`act(observation) -> action` for one episode of a shipped task (`meta` = its task.json)."""

  def __init__(self, meta: dict):
    self.meta = meta
    self.stage = 0
    self.location: tuple[str, int] | None = None

  def act(self, observation: str) -> dict:
    fix = swe_tasks.reference_fix(self.meta)
    self.stage += 1
    if self.stage == 1:
      return {"action": "bash", "command": self.meta.get("test_command", "python -m pytest -q")}
    if self.stage == 2:
      self.location = traceback_location(observation) or (fix["path"], 1)
      path, line = self.location
      return {"action": "view", "path": path, "lines": [max(1, line - 5), line + 5]}
    if self.stage == 3:
      return {"action": "str_replace", "path": fix["path"], "old": fix["old"], "new": fix["new"]}
    if self.stage == 4:
      return {"action": "bash", "command": self.meta.get("test_command", "python -m pytest -q")}
    return {"action": "submit"}


def repo_files(task: swe_tasks.SweTask) -> dict[str, list[str]]:
  """{relative path: lines} of the Python files of the task's repository as an episode starts
  (its bug made): what the random policy edits."""
  files = {}
  for root, _, names in os.walk(task.repo):
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(root, name)
        with open(path) as f:
          text = f.read()
        rel = os.path.relpath(path, task.repo)
        if task.bug is not None and task.bug.path == rel:
          text = task.bug.apply(text)
        files[rel] = text.splitlines(keepends=True)
  return files


def random_action(rng: np.random.Generator, files: dict[str, list[str]], step: int, max_steps: int = 8) -> dict:
  """A uniformly drawn action (submit at `max_steps`)."""
  if step >= max_steps:
    return {"action": "submit"}
  kind = rng.choice(["bash", "view", "str_replace", "submit"], p=[0.35, 0.3, 0.3, 0.05])
  path = sorted(files)[int(rng.integers(len(files)))]
  lines = [line for line in files[path] if line.strip()] or ["\n"]
  if kind == "bash":
    return {"action": "bash", "command": SHELL_COMMANDS[int(rng.integers(len(SHELL_COMMANDS)))]}
  if kind == "view":
    start = int(rng.integers(1, len(files[path]) + 2))
    return {"action": "view", "path": path, "lines": [start, start + int(rng.integers(1, 20))]}
  if kind == "str_replace":
    old, new = (lines[int(i)] for i in rng.integers(len(lines), size=2))
    return {"action": "str_replace", "path": path, "old": old, "new": new}
  return {"action": "submit"}
