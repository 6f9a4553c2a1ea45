"""SWE task rows: the shipped task set, SWE-Gym-style rows a user brings, and their checks.

A row names a repository folder, the issue, the visible test command and a folder of hidden
tests (pytest files, never shown to the agent):

    {"repo": "/abs/path/repo", "problem_statement": "...", "test_command": "python -m pytest -q",
     "hidden_tests": "/abs/path/hidden", "instance_id": "optional name"}

or names a task of the shipped set: {"task_id": "statlib-off_by_one-0"}. The shipped set keeps
each source repository once, envservers/data/swe_repos/<split>/<name>/ (repo/: the clean
package and its visible tests; hidden_tests/), and each task as one file,
envservers/data/swe_tasks/<split>/<task_id>.json: the repository's name, the bug as one exact
edit {path, old, new} that turns the clean repository into the buggy one (the reference fix is
its inverse), the issue text, the bug kind and `fail_to_pass`, the hidden tests the bug breaks
(pytest node ids under hidden_tests/; grading runs only these). `resolve_row` turns either row
into a `SweTask` (ValueError naming the field otherwise); `count_hidden_tests` counts the hidden
test functions statically (the reward's denominator when the repository's code breaks
collection).
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import functools
import io
import json
import os
import tarfile

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
SHIPPED_DIR = os.path.join(DATA_DIR, "swe_tasks")
REPOS_DIR = os.path.join(DATA_DIR, "swe_repos")
SPLITS = ("train", "dev", "test")  # by repository: no repository is in two splits
DEFAULT_TEST_COMMAND = "python -m pytest -q"
_SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache"})


@dataclasses.dataclass(frozen=True)
class Edit:
  """One exact edit of a repository file: `old` (occurring exactly once) becomes `new`."""

  path: str
  old: str
  new: str

  def inverse(self) -> Edit:
    return Edit(self.path, self.new, self.old)

  def apply(self, text: str) -> str:
    """`text` with the edit made; ValueError unless `old` occurs exactly once."""
    count = text.count(self.old) if self.old else 0
    if count != 1:
      raise ValueError(f"the edit of {self.path!r} expects its 'old' text exactly once, found {count} times")
    return text.replace(self.old, self.new, 1)


@dataclasses.dataclass(frozen=True)
class SweTask:
  """One task: where its repository and hidden tests are on the server's host; for a shipped
  task also the bug (applied to the clean repository at reset) and the hidden tests to run
  (node ids under `hidden_tests`; empty: all of them)."""

  instance_id: str
  repo: str
  hidden_tests: str
  problem_statement: str
  test_command: str
  bug: Edit | None = None
  selected_tests: tuple[str, ...] = ()
  grader: str = "pytest"  # "harbor": tests/test.sh grades (harbor_tasks.py)
  grade_timeout_s: float | None = None  # the task's own limit of its grading run (Harbor: [verifier] timeout_sec)
  agent_timeout_s: float | None = None  # the task's own limit of an episode (Harbor: [agent] timeout_sec)


def shipped_task_path(task_id: str) -> str | None:
  """The task.json of a shipped task, or None."""
  for split in SPLITS:
    path = os.path.join(SHIPPED_DIR, split, f"{task_id}.json")
    if os.path.isfile(path):
      return path
  return None


def shipped_repo_dir(split: str, name: str) -> str:
  """The folder of a shipped source repository ({repo/, hidden_tests/})."""
  return os.path.join(REPOS_DIR, split, name)


@functools.lru_cache(maxsize=4096)
def _shipped_task(task_id: str) -> SweTask:
  path = shipped_task_path(task_id)
  if path is None:
    raise ValueError(f"field 'task_id': no shipped SWE task {task_id!r} under {SHIPPED_DIR}")
  meta = shipped_task_meta(task_id)
  source = shipped_repo_dir(os.path.basename(os.path.dirname(path)), meta["repo_name"])
  return SweTask(
    instance_id=task_id,
    repo=os.path.join(source, "repo"),
    hidden_tests=os.path.join(source, "hidden_tests"),
    problem_statement=meta["problem_statement"],
    test_command=meta.get("test_command", DEFAULT_TEST_COMMAND),
    bug=Edit(**meta["bug"]),
    selected_tests=tuple(meta["fail_to_pass"]),
  )


def shipped_task_ids(split: str) -> list[str]:
  """The shipped tasks of `split` ("train", "dev" or "test"), sorted."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  root = os.path.join(SHIPPED_DIR, split)
  if not os.path.isdir(root):
    return []
  return sorted(name[: -len(".json")] for name in os.listdir(root) if name.endswith(".json"))


def shipped_task_meta(task_id: str) -> dict:
  """The shipped task's task.json (problem statement, bug kind, the bug edit, ...)."""
  path = shipped_task_path(task_id)
  if path is None:
    raise ValueError(f"no shipped SWE task {task_id!r}")
  with open(path) as f:
    return json.load(f)


def reference_fix(meta: dict) -> dict:
  """The fix of a shipped task ({path, old, new}: one exact edit of the buggy repository): the
  inverse of its bug."""
  return dataclasses.asdict(Edit(**meta["bug"]).inverse())


def resolve_row(row: dict | None, where: str = "row") -> SweTask:
  """The task a row names; ValueError naming `where` and the field that is wrong."""
  if not isinstance(row, dict):
    raise ValueError(f"{where}: a swe row must be an object, got {type(row).__name__}")
  if row.get("task_id") is not None and not row.get("repo"):
    if not isinstance(row["task_id"], str):
      raise ValueError(f"{where}: field 'task_id' must be a string")
    try:
      return _shipped_task(row["task_id"])
    except ValueError as e:
      raise ValueError(f"{where}: {e}") from None
  for field in ("repo", "hidden_tests", "problem_statement"):
    if not isinstance(row.get(field), str) or not row[field].strip():
      raise ValueError(
        f"{where}: field {field!r} is missing or not a non-empty string "
        f"(a swe row needs 'repo', 'problem_statement', 'hidden_tests' and may "
        f"give 'test_command'; or a shipped 'task_id')"
      )
  for field in ("repo", "hidden_tests"):
    if not os.path.isabs(row[field]):
      raise ValueError(f"{where}: field {field!r} must be an absolute path, got {row[field]!r}")
    if not os.path.isdir(row[field]):
      raise ValueError(f"{where}: field {field!r}: folder {row[field]!r} does not exist")
  command = row.get("test_command", DEFAULT_TEST_COMMAND)
  if not isinstance(command, str) or not command.strip():
    raise ValueError(f"{where}: field 'test_command' must be a non-empty string")
  if count_hidden_tests(row["hidden_tests"]) == 0:
    raise ValueError(
      f"{where}: field 'hidden_tests': {row['hidden_tests']!r} has no test functions (test_*.py files with def test_*)"
    )
  return SweTask(
    instance_id=str(row.get("instance_id") or os.path.basename(row["repo"])),
    repo=row["repo"],
    hidden_tests=row["hidden_tests"],
    problem_statement=row["problem_statement"],
    test_command=command,
  )


def _tree_stamp(folder: str) -> tuple:
  """(relative path, size, mtime) of every file: changes when the folder's content does."""
  stamp = []
  for root, dirs, files in os.walk(folder):
    dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
    for name in sorted(files):
      path = os.path.join(root, name)
      st = os.lstat(path)
      stamp.append((os.path.relpath(path, folder), st.st_size, st.st_mtime_ns))
  return tuple(stamp)


def count_hidden_tests(folder: str) -> int:
  """Test functions in the folder's test_*.py / *_test.py files (module-level `def test_*`, and
  `test_*` methods of `Test*` classes); a parametrized test counts once."""
  return _count_hidden_tests(folder, _tree_stamp(folder))


@functools.lru_cache(maxsize=4096)
def _count_hidden_tests(folder: str, stamp: tuple) -> int:
  count = 0
  for rel, _, _ in stamp:
    name = os.path.basename(rel)
    if not name.endswith(".py") or not (name.startswith("test_") or name.endswith("_test.py")):
      continue
    try:
      with open(os.path.join(folder, rel), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    except (OSError, SyntaxError, UnicodeDecodeError):
      continue
    for node in tree.body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
        count += 1
      elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
        count += sum(
          1 for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
        )
  return count


def repo_archive(folder: str, max_bytes: int) -> str:
  """The folder as a base64 .tar.gz (cached until its files change); ValueError past
  `max_bytes`."""
  data = _repo_archive(folder, _tree_stamp(folder))
  if len(data) > max_bytes:
    raise ValueError(
      f"field 'repo': {folder!r} packs to {len(data)} bytes, over the env's repo_archive_mb limit ({max_bytes} bytes)"
    )
  return data


@functools.lru_cache(maxsize=256)
def _repo_archive(folder: str, stamp: tuple) -> str:
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:
    archive.add(folder, arcname=".", filter=lambda info: None if set(info.name.split("/")) & _SKIP_DIRS else info)
  return base64.b64encode(buffer.getvalue()).decode("ascii")
