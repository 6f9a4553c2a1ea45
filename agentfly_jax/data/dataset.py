"""Dataset rows: a JSON file holding a list of objects, each with a string `question` and any
optional fields (e.g. `answer`, `tools`); the fields reach rewards by parameter name.

  rows = load_rows("data/train.json")    # [{"question": "...", "answer": "..."}, ...]

A malformed file stops the run before anything starts, with an error naming the file, the row
index and the field.
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


def load_rows(path: str | os.PathLike) -> list[dict]:
  """Loads and validates a JSON list of rows, or JSON Lines (one object per line: a `.jsonl`
  file, or a file of several objects, one a line). Errors name the file
  and the line (JSON Lines rows: "row i (line n)")."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"dataset file {path} does not exist")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  try:
    data, lines = json.loads(text), None
  except json.JSONDecodeError as e:
    if not (path.endswith(".jsonl") or text.lstrip().startswith("{")):
      raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    data, lines = [], []
    for line_no, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        data.append(json.loads(line))
      except json.JSONDecodeError as le:
        raise ValueError(f"{path}: line {line_no} is not valid JSON ({le.msg} at column {le.colno})") from None
      lines.append(line_no)
  if not isinstance(data, list):
    raise ValueError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
  if not data:
    raise ValueError(f"{path}: the list of rows is empty")
  return [validate_row(row, i, path, line=None if lines is None else lines[i]) for i, row in enumerate(data)]
