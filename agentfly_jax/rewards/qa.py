"""QA rewards with SQuAD answer normalisation: `exact_match` and token `f1`.

Normalisation (the SQuAD v1.1 evaluation script's): lower case, punctuation removed, the articles
a/an/the removed, whitespace collapsed. `answer` may be one gold string or a list of aliases;
the prediction scores its best match.

  exact_match("The Eiffel tower!", "eiffel tower")          # 1.0
  f1("Paris, France", ["Paris", "City of Light"])          # 0.667
"""

from __future__ import annotations

import collections
import re
import string

from agentfly_jax.rewards.reward import reward

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_squad(text) -> str:
  """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
  text = str(text).lower().translate(_PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


def _golds(answer) -> list[str]:
  if isinstance(answer, (list, tuple)):
    golds = [str(a) for a in answer if a is not None]
  elif answer is None:
    golds = []
  else:
    golds = [str(answer)]
  if not golds:
    raise ValueError(f"QA reward: the gold answer is empty ({answer!r}); give a string or a non-empty list of aliases")
  return golds


def _token_f1(prediction: str, gold: str) -> float:
  pred_tokens, gold_tokens = normalize_squad(prediction).split(), normalize_squad(gold).split()
  if not pred_tokens or not gold_tokens:
    return float(pred_tokens == gold_tokens)
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_tokens), same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


@reward
def exact_match(prediction, answer) -> float:
  """1.0 if the SQuAD-normalised prediction equals a normalised gold answer (or alias), else 0."""
  golds = _golds(answer)
  if prediction is None:
    return 0.0
  return float(any(normalize_squad(prediction) == normalize_squad(g) for g in golds))


@reward
def f1(prediction, answer) -> float:
  """SQuAD token F1 of the prediction against the best gold answer (or alias); 0 for None."""
  golds = _golds(answer)
  if prediction is None:
    return 0.0
  return max(_token_f1(str(prediction), g) for g in golds)
