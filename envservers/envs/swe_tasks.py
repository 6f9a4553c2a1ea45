"""SWE task rows: the shipped task set, SWE-Gym-style rows a user brings, and their checks.

A row names a repository folder, the issue, the visible test command and a folder of hidden
tests (pytest files, never shown to the agent):

    {"repo": "/abs/path/repo", "problem_statement": "...", "test_command": "python -m pytest -q",
     "hidden_tests": "/abs/path/hidden", "instance_id": "optional name"}

or names a task of the shipped set (envservers/data/swe_tasks/<split>/<task_id>/): {"task_id":
"statlib-off_by_one-0"}. `resolve_row` turns either into a `SweTask` (ValueError naming the field
otherwise); `count_hidden_tests` counts the hidden test functions statically (the reward's
denominator when the repository's code breaks collection).
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

SHIPPED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                           "swe_tasks")
SPLITS = ("train", "test")
DEFAULT_TEST_COMMAND = "python -m pytest -q"
_SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache"})


@dataclasses.dataclass(frozen=True)
class SweTask:
  """One task: where its repository and hidden tests are on the server's host."""
  instance_id: str
  repo: str
  hidden_tests: str
  problem_statement: str
  test_command: str


def shipped_task_dir(task_id: str) -> str | None:
  """The folder of a shipped task, or None."""
  for split in SPLITS:
    path = os.path.join(SHIPPED_DIR, split, task_id)
    if os.path.isfile(os.path.join(path, "task.json")):
      return path
  return None


@functools.lru_cache(maxsize=4096)
def _shipped_task(task_id: str) -> SweTask:
  path = shipped_task_dir(task_id)
  if path is None:
    raise ValueError(f"field 'task_id': no shipped SWE task {task_id!r} under {SHIPPED_DIR}")
  with open(os.path.join(path, "task.json")) as f:
    meta = json.load(f)
  return SweTask(instance_id=task_id, repo=os.path.join(path, "repo"),
                 hidden_tests=os.path.join(path, "hidden_tests"),
                 problem_statement=meta["problem_statement"],
                 test_command=meta.get("test_command", DEFAULT_TEST_COMMAND))


def shipped_task_ids(split: str) -> list[str]:
  """The shipped tasks of `split` ("train" or "test"), sorted."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  root = os.path.join(SHIPPED_DIR, split)
  if not os.path.isdir(root):
    return []
  return sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "task.json")))


def shipped_task_meta(task_id: str) -> dict:
  """The shipped task's task.json (problem statement, bug kind, the reference fix, ...)."""
  path = shipped_task_dir(task_id)
  if path is None:
    raise ValueError(f"no shipped SWE task {task_id!r}")
  with open(os.path.join(path, "task.json")) as f:
    return json.load(f)


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
      raise ValueError(f"{where}: field {field!r} is missing or not a non-empty string "
                       f"(a swe row needs 'repo', 'problem_statement', 'hidden_tests' and may "
                       f"give 'test_command'; or a shipped 'task_id')")
  for field in ("repo", "hidden_tests"):
    if not os.path.isabs(row[field]):
      raise ValueError(f"{where}: field {field!r} must be an absolute path, got {row[field]!r}")
    if not os.path.isdir(row[field]):
      raise ValueError(f"{where}: field {field!r}: folder {row[field]!r} does not exist")
  command = row.get("test_command", DEFAULT_TEST_COMMAND)
  if not isinstance(command, str) or not command.strip():
    raise ValueError(f"{where}: field 'test_command' must be a non-empty string")
  if count_hidden_tests(row["hidden_tests"]) == 0:
    raise ValueError(f"{where}: field 'hidden_tests': {row['hidden_tests']!r} has no test "
                     f"functions (test_*.py files with def test_*)")
  return SweTask(instance_id=str(row.get("instance_id") or os.path.basename(row["repo"])),
                 repo=row["repo"], hidden_tests=row["hidden_tests"],
                 problem_statement=row["problem_statement"], test_command=command)


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
        count += sum(1 for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name.startswith("test"))
  return count


def repo_archive(folder: str, max_bytes: int) -> str:
  """The folder as a base64 .tar.gz (cached until its files change); ValueError past
  `max_bytes`."""
  data = _repo_archive(folder, _tree_stamp(folder))
  if len(data) > max_bytes:
    raise ValueError(f"field 'repo': {folder!r} packs to {len(data)} bytes, over the env's "
                     f"repo_archive_mb limit ({max_bytes} bytes)")
  return data


@functools.lru_cache(maxsize=256)
def _repo_archive(folder: str, stamp: tuple) -> str:
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:
    archive.add(folder, arcname=".",
                filter=lambda info: None if set(info.name.split("/")) & _SKIP_DIRS else info)
  return base64.b64encode(buffer.getvalue()).decode("ascii")
