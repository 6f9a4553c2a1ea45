"""Built-in rewards: numeric match of the prediction against the row's answer (`exact_match`, the
SQuAD-normalised one, lives in qa.py and is re-exported here for older imports)."""

from __future__ import annotations

import re

from agentfly_jax.rewards.qa import exact_match  # noqa: F401  (older import path)
from agentfly_jax.rewards.reward import reward

_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def normalize_answer(text) -> str:
  """Lower-case, strip, collapse whitespace, drop trailing punctuation."""
  return " ".join(str(text).lower().split()).rstrip(".!?")


def last_number(text) -> float | None:
  """The last number written in `text` (commas as thousands separators allowed), or None."""
  found = _NUMBER_RE.findall(str(text))
  if not found:
    return None
  try:
    return float(found[-1].replace(",", ""))
  except ValueError:
    return None


@reward
def numeric_match(prediction, answer) -> dict:
  """1.0 if the last number in the prediction equals the answer (relative tol 1e-6)."""
  target = last_number(answer)
  got = None if prediction is None else last_number(prediction)
  ok = got is not None and target is not None and abs(got - target) <= 1e-6 * max(1.0, abs(target))
  return {"reward": float(ok), "has_number": float(got is not None)}
