"""Helpers for the swe env tests: a small repository with a bug and its hidden tests, written to
a folder; pytest on the host as the independent reference of the hidden-test reward."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

BUGGY_MODULE = '''def add(a, b):
  return a - b


def double(x):
  return 2 * x


def half(x):
  return x / 2
'''
FILES = {
  "pkg/__init__.py": "",
  "pkg/m.py": BUGGY_MODULE,
  "tests/test_m.py": "from pkg.m import add, double\n\n\ndef test_add():\n  assert add(1, 2) == 3\n\n\n"
  "def test_double():\n  assert double(2) == 4\n",
  "README.md": "pkg: arithmetic.\n" + "filler line\n" * 40,
}
HIDDEN = {
  "test_hidden.py": "from pkg.m import add, double, half\n\n\ndef test_add_small():\n  assert add(2, 2) == 4\n\n\n"
  "def test_add_zero():\n  assert add(0, 5) == 5\n\n\n"
  "def test_double():\n  assert double(3) == 6\n\n\n"
  "def test_half():\n  assert half(3) == 1.5\n",
}


def write(files: dict[str, str], root) -> str:
  for rel, text in files.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
  return str(root)


def make_task(root) -> dict:
  """A row for a 4-file repository whose `add` subtracts (2 of 4 hidden tests fail)."""
  repo = write(FILES, os.path.join(root, "repo"))
  hidden = write(HIDDEN, os.path.join(root, "hidden"))
  return {
    "repo": repo,
    "hidden_tests": hidden,
    "problem_statement": "add() subtracts.",
    "test_command": "python -m pytest -q tests",
    "instance_id": "tiny-add",
  }


def host_pytest_fraction(repo: str, hidden: str, tmp) -> float:
  """Passed / collected of the hidden tests against `repo`, by pytest on the host (no sandbox)."""
  junit = os.path.join(str(tmp), "reference_junit.xml")
  env = dict(os.environ, PYTHONPATH=repo, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1")
  subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      "-q",
      "-p",
      "no:cacheprovider",
      "-c",
      os.devnull,
      "--rootdir",
      repo,
      "--import-mode=importlib",
      f"--junitxml={junit}",
      hidden,
    ],
    cwd=repo,
    env=env,
    capture_output=True,
    timeout=120,
  )
  cases = list(ElementTree.parse(junit).getroot().iter("testcase"))
  passed = sum(1 for c in cases if not any(ch.tag in ("failure", "error") for ch in c))
  return passed / len(cases)
