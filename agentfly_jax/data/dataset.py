"""Dataset rows: a JSON file holding a list of objects (or a `.jsonl` file, one object a line), each
with a string `question` and any optional fields (e.g. `answer`, `tools`); the fields reach rewards
by parameter name.

  rows = load_rows("data/train.json")    # [{"question": "...", "answer": "..."}, ...]

A malformed file stops the run before anything starts, with an error naming the file, the row
index (and a JSON Lines row's line) and the field. A task reads a file with `read_rows` (parsed,
not checked: tasks/contract.checked_rows checks each row once, naming its line).
"""

from __future__ import annotations

import json
import os
from typing import Any


def validate_row(row: Any, index: int, source: str = "rows", line: int | None = None) -> dict:
  """Checks one row; raises ValueError naming `source`, the row index (and line) and the field."""
  where = f"{source}: row {index}" + (f" (line {line})" if line is not None else "")
  if not isinstance(row, dict):
    raise ValueError(f"{where} must be a JSON object, got {type(row).__name__}")
  if "question" not in row:
    raise ValueError(f"{where} has no field 'question' (fields: {sorted(row)})")
  if not isinstance(row["question"], str) or not row["question"].strip():
    raise ValueError(f"{where} field 'question' must be a non-empty string, got {row['question']!r:.80}")
  tools = row.get("tools")
  if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
    raise ValueError(f"{where} field 'tools' must be a list of tool names, got {tools!r:.80}")
  return row


def _json_lines(text: str, path: str) -> tuple[list, list[int]]:
  """The objects of a JSON Lines text, one a line (blank lines skipped), and their line numbers."""
  data, lines = [], []
  for line_no, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      data.append(json.loads(line))
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: line {line_no} is not valid JSON ({e.msg} at column {e.colno})") from None
    lines.append(line_no)
  return data, lines


class FileRows(list):
  """The rows of a file as parsed, not yet checked: a list, with the file's `path` and each row's
  `lines` (None for a JSON list: rows are named by index alone)."""

  def __init__(self, rows, path: str, lines: list[int] | None):
    super().__init__(rows)
    self.path, self.lines = path, lines


def read_rows(path: str | os.PathLike) -> FileRows:
  """Parses a file of rows without checking them (the checks: `validate_row` per row, with its
  line): a `.jsonl` file is JSON Lines (one object a line, any number of rows, one included); any
  other file is a JSON list of rows (or, when it does not parse as one JSON value, JSON Lines).
  Errors name the file (and a line that does not parse)."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"dataset file {path} does not exist")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if path.endswith(".jsonl"):
    data, lines = _json_lines(text, path)
  else:
    try:
      data, lines = json.loads(text), None
    except json.JSONDecodeError as e:
      if not text.lstrip().startswith("{"):
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
      data, lines = _json_lines(text, path)
    if isinstance(data, dict):
      raise ValueError(f"{path}: expected a JSON list of rows, got dict (one row a line: name the file .jsonl)")
  if not isinstance(data, list):
    raise ValueError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
  if not data:
    raise ValueError(f"{path}: the list of rows is empty")
  return FileRows(data, path, lines)


def load_rows(path: str | os.PathLike) -> list[dict]:
  """Loads and validates a file of rows (`read_rows`, then `validate_row` per row). Errors name the
  file and the row (JSON Lines rows: "row i (line n)")."""
  rows = read_rows(path)
  return [validate_row(row, i, rows.path, line=row_line(rows, i)) for i, row in enumerate(rows)]


def row_line(rows, index: int) -> int | None:
  """The file line of row `index` when `rows` came from a JSON Lines file (`read_rows`), else None."""
  lines = getattr(rows, "lines", None)
  return None if lines is None else lines[index]
