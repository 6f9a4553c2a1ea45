"""Per-turn rewards and anchor states of a step's trajectories, as the arrays the turn-level
estimators read (rl/core/turn_advantages.py: turn_gae, gigpo).

    arrays.update(turn_arrays(trajs))     # when needs_turn_arrays(spec.algorithm.estimator)

`turn_rewards f32[B, K]`: `Trajectory.turn_rewards` (one per model turn: the env step rewards its
tool calls returned), 0 beyond a chain's turns. `anchor_ids int32[B, K]`: the anchor state of each
turn, GiGPO's grouping key: the token ids of the observation the turn acted on (the prompt for turn
0, else the tool observation / template text between the previous turn and this one), numbered by
first appearance in the batch, so equal ids = identical observations (the estimator pools only
turns of one group). K = the most turns of any chain, rounded up to `multiple` (few compiles).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentfly_jax.rl.batching import bucket

TURN_ESTIMATORS = ("turn_gae", "gigpo")  # = rl/core/turn_advantages.TURN_ESTIMATORS (no JAX here)


def needs_turn_arrays(estimator: str) -> bool:
  """Whether advantage estimator `estimator` reads `turn_arrays`."""
  return estimator in TURN_ESTIMATORS


def turn_spans(action_mask: np.ndarray) -> list[tuple[int, int]]:
  """[(start, end)) of each run of consecutive action tokens (one per model turn), in order."""
  a = np.asarray(action_mask, bool)
  edges = np.diff(np.concatenate([[0], a.astype(np.int8), [0]]))
  return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def turn_arrays(trajs: Sequence, *, multiple: int = 4) -> dict[str, np.ndarray]:
  """{"turn_rewards": f32[B, K], "anchor_ids": int32[B, K]} of `trajs` (see the module docstring).
  A trajectory whose `turn_rewards` length differs from its turns (runs of its action mask) is an
  error naming it."""
  spans = [turn_spans(t.action_mask) for t in trajs]
  k = bucket(max((len(s) for s in spans), default=1), multiple)
  rewards = np.zeros((len(trajs), k), np.float32)
  anchors = np.zeros((len(trajs), k), np.int32)
  seen: dict[bytes, int] = {}
  for i, (t, sp) in enumerate(zip(trajs, spans)):
    tr = list(getattr(t, "turn_rewards", None) or [])
    if tr and len(tr) != len(sp):
      raise ValueError(
        f"trajectory (group {t.group_id}, chain {t.chain_id}): {len(tr)} turn_rewards for {len(sp)} model turns "
        f"(runs of its action mask)"
      )
    rewards[i, : len(tr)] = tr
    prev_end = 0
    for j, (start, end) in enumerate(sp):
      key = np.asarray(t.token_ids[prev_end:start], np.int32).tobytes()
      anchors[i, j] = seen.setdefault(key, len(seen))
      prev_end = end
  return {"turn_rewards": rewards, "anchor_ids": anchors}
