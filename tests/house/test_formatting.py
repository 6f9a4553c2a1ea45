"""One formatter for the whole tree (pyproject.toml [tool.ruff]: 2-space indents, 120 columns), applied:
`ruff format --check` finds nothing to change. Fix with `.venv/bin/python -m ruff format .`."""

import subprocess
import sys

from train_cli import ROOT


def test_the_tree_is_formatted():
  out = subprocess.run(
    [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
  )
  assert out.returncode == 0, (
    "files not formatted (run `.venv/bin/python -m ruff format .`):\n" + out.stdout + out.stderr
  )[-3000:]
