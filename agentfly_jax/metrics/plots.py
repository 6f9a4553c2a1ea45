"""Plots of training curves (matplotlib, headless)."""
from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_curves(records: Sequence[dict], keys: Sequence[str], path: str, *, title: str = "",
                smooth: int = 1) -> str:
  """Plots metric `keys` against `step` from JSONL-style records into a PNG at `path`."""
  fig, ax = plt.subplots(figsize=(7, 4))
  for key in keys:
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    if not pts:
      continue
    steps, values = zip(*pts)
    if smooth > 1:
      values = [sum(values[max(0, i - smooth + 1):i + 1]) / len(values[max(0, i - smooth + 1):i + 1])
                for i in range(len(values))]
    ax.plot(steps, values, label=key)
  ax.set_xlabel("step")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
