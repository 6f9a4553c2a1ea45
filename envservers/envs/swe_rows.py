"""Bring-your-own SWE rows (SWE-Gym style): load them and check each before any training.

    rows = load_swe_rows("my_tasks.jsonl")   # JSON list or JSON Lines

Each row: {"repo": folder, "problem_statement": str, "hidden_tests": folder of pytest files,
"test_command": str (default "python -m pytest -q"), "instance_id": optional}. Every row is
checked in the real sandbox: its fields (swe_tasks.resolve_row), that the test command runs on
the unmodified repository (not "command not found", not a pytest usage error or an empty
collection), and that the hidden tests do not already all pass (there would be nothing to fix).
The first bad row stops the load with a ValueError naming the file, the row and the field.
"""

from __future__ import annotations

import json
import os

import trio

from envservers.envs import swe_tasks

# Exit statuses of a test command that did not run the tests: shell "cannot execute" / "not
# found", pytest's internal error, usage error and "no tests collected".
NOT_RUN_EXIT_CODES = {
  126: "the command cannot be executed",
  127: "the command was not found",
  3: "pytest had an internal error",
  4: "pytest reported a usage error",
  5: "no tests were collected",
}


def read_rows(path: str) -> list[dict]:
  """A JSON list or JSON Lines file of rows; ValueError naming the file and line."""
  if not os.path.isfile(path):
    raise ValueError(f"swe rows file {path!r} does not exist")
  with open(path) as f:
    text = f.read()
  if text.lstrip().startswith("["):
    try:
      rows = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON: {e}") from None
  else:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise ValueError(f"{path} line {number}: not valid JSON: {e}") from None
  return rows


async def check_row(env, row: dict, where: str) -> dict:
  """Runs one row's checks on a started SweEnv; returns the row with 'question' set."""
  task = swe_tasks.resolve_row(row, where)
  await env.reset(row)
  ran = await env.run_visible_tests()
  code = ran.get("exit_code")
  if ran.get("timed_out"):
    raise ValueError(
      f"{where}: field 'test_command': {task.test_command!r} ran past the "
      f"{env.timeout_s:g} s limit on the unmodified repository"
    )
  if code in NOT_RUN_EXIT_CODES:
    raise ValueError(
      f"{where}: field 'test_command': {task.test_command!r} cannot run on the "
      f"unmodified repository ({NOT_RUN_EXIT_CODES[code]}, exit status {code}): "
      f"{ran.get('output', '')[-400:]}"
    )
  graded = await env.grade()
  if graded["total"] and graded["passed"] == graded["total"]:
    raise ValueError(
      f"{where}: field 'hidden_tests': all {graded['total']} hidden tests already "
      f"pass on the unmodified repository (nothing to fix)"
    )
  return {**row, "question": row.get("question") or task.problem_statement}


def check_rows(rows: list[dict], source: str = "rows", **env_options) -> list[dict]:
  """Checks every row in a local sandbox (see the module docstring); returns them with a
  'question' field (the problem statement) for the trainer."""
  from envservers.envs.swe import SweEnv

  async def main():
    checked = []
    env = SweEnv(**env_options)
    try:
      for i, row in enumerate(rows):
        checked.append(await check_row(env, row, f"{source} row {i}"))
    finally:
      await env.close()
    return checked

  if not isinstance(rows, list) or not rows:
    raise ValueError(f"{source}: expected a non-empty list of rows")
  for i, row in enumerate(rows):  # the fields of every row first: no sandbox needed
    swe_tasks.resolve_row(row, f"{source} row {i}")
  return trio.run(main)


def load_swe_rows(path: str, **env_options) -> list[dict]:
  """Reads and checks a rows file (see the module docstring)."""
  return check_rows(read_rows(path), source=path, **env_options)
