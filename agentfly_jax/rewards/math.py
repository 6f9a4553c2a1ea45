"""`math_equal`: 1.0 when the prediction's final answer equals the gold one mathematically
(math-verify: LaTeX and plain expressions parsed with sympy).

Counts equivalent forms: fractions vs decimals (`3/4`, `0.75`, `\\frac{3}{4}`), `\\boxed{...}`,
thousands separators (`1,048,576`), `x = 3` vs `3`, `2^{10}` vs `1024`. A list of gold answers
scores the best. Parsing and comparison are each time-limited (5 s) on the main thread; in
worker threads (math-verify's limit uses SIGALRM) the input is capped at 2,000 characters
instead.
"""

from __future__ import annotations

import re
import threading

from agentfly_jax.rewards.reward import reward

MAX_CHARS = 2000


def _verify_fns():
  from math_verify import parse, verify  # imported on first use (sympy is slow to import)

  return parse, verify


_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")


def _as_math(text: str) -> str:
  """`text` in $...$ when it is a bare expression (no $, no \\boxed, no words), so math-verify
  reads `2^{10}` as LaTeX; prose ('The answer is 42.') is left for its answer extraction."""
  if "$" in text or "\\boxed" in text or _WORD.search(_LATEX_COMMAND.sub(" ", text)):
    return text
  return f"${text.strip()}$"


def _parse(text: str, timeout):
  parse, _ = _verify_fns()
  wrapped = _as_math(text)
  parsed = parse(wrapped, parsing_timeout=timeout)
  if not parsed and wrapped != text:
    parsed = parse(text, parsing_timeout=timeout)
  return parsed


def _equal(prediction: str, gold: str) -> bool:
  _, verify = _verify_fns()
  timeout = 5 if threading.current_thread() is threading.main_thread() else None
  gold_parsed = _parse(gold, timeout)
  pred_parsed = _parse(prediction[-MAX_CHARS:], timeout)
  if not gold_parsed or not pred_parsed:
    return False
  return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


@reward
def math_equal(prediction, answer) -> float:
  """1.0 if the prediction's answer is mathematically equal to `answer` (or one of a list)."""
  if prediction is None:
    return 0.0
  golds = [str(a) for a in answer] if isinstance(answer, (list, tuple)) else [str(answer)]
  if not golds:
    raise ValueError("math_equal: the gold answer list is empty")
  try:
    return float(any(_equal(str(prediction), g) for g in golds))
  except Exception:  # noqa: BLE001 -- an unparsable or pathological answer scores 0
    return 0.0
