"""The training rows as a stream of epochs: every row once per epoch, in an order reshuffled per
epoch by the run's seed.

  stream = RowStream(rows, seed=0)
  batch = stream.at(position, 8)      # rows position..position+7 of the endless stream

A run's data position (saved in its checkpoints) is the index into this stream, so a resumed run
reads on exactly where it stopped.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class RowStream:
  """Epochs over `rows`: epoch e is `rows` in the order of `np.random.default_rng([seed, e])`'s
  permutation."""

  def __init__(self, rows: Sequence[dict], seed: int):
    if not rows:
      raise ValueError("RowStream: no rows to stream")
    self.rows, self.seed = tuple(rows), int(seed)
    self._orders: dict[int, np.ndarray] = {}

  def __len__(self) -> int:
    """The rows of one epoch."""
    return len(self.rows)

  def order(self, epoch: int) -> np.ndarray:
    """int[len(self)]: the row indices of epoch `epoch`, in order."""
    if epoch not in self._orders:
      if len(self._orders) > 4:
        self._orders.clear()
      self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
    return self._orders[epoch]

  def at(self, position: int, n: int) -> list[dict]:
    """Rows position..position+n-1 of the stream (across epoch boundaries)."""
    out = []
    for p in range(position, position + n):
      epoch, i = divmod(p, len(self.rows))
      out.append(self.rows[int(self.order(epoch)[i])])
    return out
