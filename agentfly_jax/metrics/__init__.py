"""Metric writers (JSONL, TensorBoard, W&B) and plots."""

from agentfly_jax.metrics.writers import (
  JsonlWriter,
  MultiWriter,
  TensorBoardWriter,
  WandbWriter,
  read_jsonl,
  truncate_jsonl,
)
from agentfly_jax.metrics.plots import plot_curves

__all__ = [
  "JsonlWriter",
  "MultiWriter",
  "TensorBoardWriter",
  "WandbWriter",
  "read_jsonl",
  "truncate_jsonl",
  "plot_curves",
]
