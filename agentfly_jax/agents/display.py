"""Show a trajectory with its action mask: model-written tokens highlighted.

print(format_trajectory(trajectory, agent.tokenizer))           # ANSI colours
print(format_trajectory(trajectory, agent.tokenizer, color=False))  # ⟦model text⟧ brackets
"""

from __future__ import annotations

from typing import Any

import numpy as np

_GREEN, _DIM, _RESET = "\033[42;30m", "\033[2m", "\033[0m"


def mask_segments(action_mask: np.ndarray) -> list[tuple[int, int, bool]]:
  """Runs of equal mask values as (start, end, is_model) half-open spans, in order."""
  mask = np.asarray(action_mask, dtype=bool)
  if mask.size == 0:
    return []
  change = np.flatnonzero(mask[1:] != mask[:-1]) + 1
  starts = np.concatenate([[0], change])
  ends = np.concatenate([change, [mask.size]])
  return [(int(s), int(e), bool(mask[s])) for s, e in zip(starts, ends)]


def format_trajectory(trajectory: Any, tokenizer: Any, color: bool = True, show_header: bool = True) -> str:
  """The trajectory's text with sampler-generated spans highlighted (green, or ⟦ ⟧ brackets),
  template/observation text dimmed, and a one-line summary on top."""
  pieces = []
  for start, end, is_model in mask_segments(trajectory.action_mask):
    text = tokenizer.decode(trajectory.token_ids[start:end])
    if is_model:
      pieces.append(f"{_GREEN}{text}{_RESET}" if color else f"⟦{text}⟧")
    else:
      pieces.append(f"{_DIM}{text}{_RESET}" if color else text)
  body = "".join(pieces)
  if not show_header:
    return body
  n_model = int(np.sum(trajectory.action_mask))
  header = (
    f"group {trajectory.group_id} chain {trajectory.chain_id} | {len(trajectory)} tokens, "
    f"{n_model} generated | turns {trajectory.num_turns} | finish {trajectory.finish_reason}"
    f" | reward {trajectory.reward:.3f} | tool calls {len(trajectory.tool_calls)}"
  )
  if getattr(trajectory, "error", None):
    header += f"\nerror: {trajectory.error}"
  return f"{header}\n{body}"
