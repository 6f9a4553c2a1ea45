"""Metric writers: JSONL (always), TensorBoard (tensorboardX), W&B (optional), and a fan-out."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import numpy as np


def _to_python(value: Any):
  if isinstance(value, (np.generic, np.ndarray)):
    value = value.item() if np.ndim(value) == 0 else np.asarray(value).tolist()
  elif hasattr(value, "shape") and hasattr(value, "dtype"):  # jax arrays
    value = np.asarray(value)
    value = value.item() if value.ndim == 0 else value.tolist()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class JsonlWriter:
  """One JSON object per step: {"step": s, **metrics}. Appends, so a resumed run continues the file."""

  def __init__(self, path: str):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self.path = path
    self._file = open(path, "a", encoding="utf-8")

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    record = {"step": int(step)}
    record.update({k: _to_python(v) for k, v in metrics.items()})
    self._file.write(json.dumps(record, sort_keys=True) + "\n")
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def read_jsonl(path: str) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def truncate_jsonl(path: str, last_step: int) -> None:
  """Drops records with step > last_step (used on resume so replayed steps are not duplicated)."""
  if not os.path.exists(path):
    return
  records = [r for r in read_jsonl(path) if r.get("step", 0) <= last_step]
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, sort_keys=True) + "\n")


class TensorBoardWriter:
  def __init__(self, logdir: str):
    from tensorboardX import SummaryWriter

    self._writer = SummaryWriter(logdir)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    for key, value in metrics.items():
      value = _to_python(value)
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        self._writer.add_scalar(key, value, int(step))
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class WandbWriter:
  def __init__(self, project: str, config: Mapping[str, Any] | None = None, name: str | None = None):
    try:
      import wandb
    except ImportError as e:
      raise ImportError("--wandb needs the `wandb` package: pip install wandb") from e
    self._run = wandb.init(project=project, config=dict(config or {}), name=name)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    self._run.log({k: _to_python(v) for k, v in metrics.items()}, step=int(step))

  def close(self) -> None:
    self._run.finish()


class MultiWriter:
  def __init__(self, writers):
    self.writers = list(writers)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    for w in self.writers:
      w.write(step, metrics)

  def close(self) -> None:
    for w in self.writers:
      w.close()
