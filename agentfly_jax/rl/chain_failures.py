"""A run whose chains fail stops, with the first failure named: `ChainFailureGuard`.

  guard = ChainFailureGuard(max_error_share=0.5, patience=3)
  guard.check(step, trajectories)     # raises ChainsFailedError, or returns the step's error share

A failed chain is one that raised (the built-in rollout's or a black-box agent's: `finish_reason ==
"error"`; it trains nothing) or ran past the chain timeout (`"timeout"`, config.rollout.chain_timeout_s:
its tokens train, scored on what it had answered, but a run whose chains hang is failing all the same).
When every chain of a step failed, or the share of failed chains stays above `max_error_share` for
`patience` steps in a row, training goes on on nothing; the guard raises
instead, naming the first failed chain's exception (`Trajectory.error`) and where it was raised
(`Trajectory.error_frame`, the traceback's last frame). Segments of one chain count once.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

FAILED_FINISHES = ("error", "timeout")  # the finish reasons of a failed chain


class ChainsFailedError(RuntimeError):
  """The run's chains fail: the message names the step, the share and the first chain's error."""


def error_share(trajs: Sequence) -> tuple[float, object | None, int, int]:
  """(share of failed chains, the first failed trajectory or None, failed, chains) of one step."""
  chains: dict[tuple[int, int], object] = {}
  for t in trajs:
    key = (t.group_id, t.chain_id)
    if key not in chains or t.finish_reason in FAILED_FINISHES:
      chains[key] = t
  failed = [t for t in chains.values() if t.finish_reason in FAILED_FINISHES]
  first = min(failed, key=lambda t: (t.group_id, t.chain_id)) if failed else None
  return (len(failed) / len(chains) if chains else 0.0), first, len(failed), len(chains)


def failure_counts(trajs: Sequence) -> dict[str, int]:
  """finish reason -> failed chains of one step (segments of one chain count once)."""
  chains = {(t.group_id, t.chain_id): t.finish_reason for t in trajs if t.finish_reason in FAILED_FINISHES}
  return dict(sorted(collections.Counter(chains.values()).items()))


@dataclasses.dataclass
class ChainFailureGuard:
  """Stops a run whose chains fail (see the module docstring).

  Args:
    max_error_share: a step with a larger share of failed chains counts toward `patience`.
    patience: that many such steps in a row stop the run (a step where every chain failed stops it
      at once).
    where: how bad settings are named ("config.rollout." in a run: max_error_share / error_patience).
  """

  max_error_share: float = 0.5
  patience: int = 3
  where: str = "ChainFailureGuard: "
  streak: int = 0

  def __post_init__(self):
    share = self.max_error_share
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
      raise ValueError(f"{self.where}max_error_share={share!r}: must be in [0, 1]")
    if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
      raise ValueError(f"{self.where}patience={self.patience!r}: must be an int >= 1")

  def check(self, step: int, trajs: Sequence) -> float:
    """The step's error share; raises ChainsFailedError when the run must stop."""
    share, first, failed, chains = error_share(trajs)
    kinds = failure_counts(trajs)
    self.streak = self.streak + 1 if share > self.max_error_share else 0
    every = chains > 0 and failed == chains
    if not every and self.streak < self.patience:
      return share
    counts = (
      f" finish={next(iter(kinds))}"
      if len(kinds) == 1
      else ": " + ", ".join(f"{n} finish={r}" for r, n in kinds.items())
    )
    if every:
      why = f"step {step}: every chain failed ({failed} of {chains}{counts})"
    else:
      why = (
        f"step {step}: the share of failed chains stayed above {self.max_error_share} for {self.streak} steps "
        f"({failed} of {chains}{counts} at this step)"
      )
    what = first.error or f"ran past config.rollout.chain_timeout_s (finish={first.finish_reason})"
    where = f"\n  at {first.error_frame}" if first.error_frame else ""
    raise ChainsFailedError(
      f"{why}; the first (group {first.group_id}, chain {first.chain_id}): {what}{where}\n"
      "(limits: config.rollout.max_error_share / config.rollout.error_patience)"
    )
