"""Plots of training curves (matplotlib, headless)."""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


_LINE_STYLES = ("-", "--", ":", "-.")


def plot_curves(
  records: Sequence[dict],
  keys: Sequence[str],
  path: str,
  *,
  title: str = "",
  smooth: int = 1,
  labels: dict | None = None,
) -> str:
  """Plots metric `keys` against `step` from JSONL-style records into a PNG at `path`.

  `labels` maps a key to its legend text (default: the key). A series logged at fewer than half
  the steps of the densest one (e.g. a periodic greedy eval) is drawn with point markers. Each
  series has its own line style, and each is drawn thinner than the one before it, so series with
  the same values (a 0/1 reward and the success rate) both stay visible.
  """
  fig, ax = plt.subplots(figsize=(7, 4))
  counts = [sum(isinstance(r.get(k), (int, float)) for r in records) for k in keys]
  for i, (key, count) in enumerate(zip(keys, counts)):
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    if not pts:
      continue
    steps, values = zip(*pts)
    if smooth > 1:
      values = [
        sum(values[max(0, i - smooth + 1) : i + 1]) / len(values[max(0, i - smooth + 1) : i + 1])
        for i in range(len(values))
      ]
    sparse = count < max(counts) / 2
    ax.plot(
      steps,
      values,
      label=(labels or {}).get(key, key),
      marker="o" if sparse else None,
      linestyle=_LINE_STYLES[i % len(_LINE_STYLES)],
      linewidth=max(1.0, 3.5 - 1.2 * i),
      markersize=max(3.0, 7.0 - 2.0 * i),
    )
  ax.set_xlabel("step")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
