"""A judge's rubric: criteria, weights and a scale, rendered into the judge's prompt; its replies parsed.

    rubric = Rubric([Criterion("correct", "the answer equals the reference", weight=2.0),
                     Criterion("concise", "no more words than needed")], scale=(0, 10))
    messages = chain_messages(rubric, question=..., prediction=..., reference=...)
    scores = parse_scores(reply_text, rubric)        # {"correct": 8.0, "concise": 5.0}, or None
    rubric_score(rubric, scores)                     # (2 * 0.8 + 1 * 0.5) / 3 = 0.7

Per-chain scoring: the judge scores one response on every criterion, within the scale; the reward is the
weighted mean of the criteria's scores mapped to [0, 1]: sum_i w_i (s_i - lo) / (hi - lo) / sum_i w_i.

Group scoring (RULER-style): the judge sees the G responses of one row together, labelled "1".."G", and ranks
them best first; an element of the ranking may be a list of tied labels. `rank_scores` maps a ranking to
scores: a response at 0-based position p of G gets 1 - p / (G - 1) (best 1, worst 0); a block of k tied
responses starting at position p shares the mean position p + (k - 1) / 2. The scores of a group always
average 0.5; one response alone scores 1.

A reply that is not the JSON asked for (no object, a criterion missing or off the scale, a ranking that is not
a permutation of the labels) parses to None: the judge reward then scores `unparsed_score` and counts it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from typing import Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHAIN_SYSTEM = (
  "You are a strict, fair judge. Score the response on each criterion of the rubric with a number from "
  "{{ lo }} to {{ hi }} ({{ hi }} = fully met). Reply with one JSON object and nothing else: "
  '{"scores": {{ example }}}'
)
CHAIN_USER = """Task:
{{ question }}
{% if reference %}
Reference answer:
{{ reference }}
{% endif %}{% if transcript %}
Transcript:
{{ transcript }}
{% endif %}
Response to judge:
{{ prediction }}

Rubric (score each criterion from {{ lo }} to {{ hi }}):
{% for c in criteria %}- {{ c.name }} (weight {{ c.weight }}): {{ c.description }}
{% endfor %}"""

GROUP_SYSTEM = (
  "You are a strict, fair judge. Rank the {{ n }} responses to the same task from best to worst by the rubric. "
  'Reply with one JSON object and nothing else: {"ranking": [...]}, the response labels best first; '
  'put tied responses in a list, e.g. {"ranking": ["2", ["1", "3"]]}.'
)
GROUP_USER = """Task:
{{ question }}
{% if reference %}
Reference answer:
{{ reference }}
{% endif %}
Rubric:
{% for c in criteria %}- {{ c.name }} (weight {{ c.weight }}): {{ c.description }}
{% endfor %}{% for r in responses %}
Response {{ loop.index }}:
{{ r }}
{% endfor %}"""


@dataclasses.dataclass(frozen=True)
class Criterion:
  name: str
  description: str
  weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class Rubric:
  """Criteria (at least one, distinct names, weights > 0) and the scale [lo, hi] the judge scores on.
  `where` names the rubric's source in errors (a config field)."""

  criteria: tuple[Criterion, ...]
  scale: tuple[float, float] = (0.0, 10.0)
  where: str = "rubric"

  def __post_init__(self):
    object.__setattr__(self, "criteria", tuple(self.criteria))
    if not self.criteria:
      raise ValueError(f"{self.where}: a rubric needs at least one criterion (name, description, weight); got none")
    names = [c.name for c in self.criteria]
    for c in self.criteria:
      if not isinstance(c.name, str) or not c.name.strip():
        raise ValueError(f"{self.where}: criterion {c!r} has no name")
      if not isinstance(c.weight, numbers.Real) or not c.weight > 0 or not math.isfinite(c.weight):
        raise ValueError(f"{self.where}: criterion {c.name!r} has weight {c.weight!r}; weights must be numbers > 0")
    if len(set(names)) != len(names):
      raise ValueError(f"{self.where}: criterion names must be distinct, got {names}")
    lo, hi = (float(x) for x in self.scale)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
      raise ValueError(f"{self.where}: scale must be two finite numbers lo < hi, got {self.scale!r}")
    object.__setattr__(self, "scale", (lo, hi))


_ENV = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def _render(source: str, **values) -> str:
  """`source` (a jinja2 template: the defaults above or the user's) rendered; an undefined name is an error."""
  return _ENV.from_string(source).render(**values)


def chain_messages(
  rubric: Rubric,
  *,
  question: str,
  prediction: str,
  reference: str = "",
  transcript: str = "",
  system_template: str = CHAIN_SYSTEM,
  user_template: str = CHAIN_USER,
) -> list[dict]:
  """The chat messages asking the judge to score one response on `rubric`."""
  lo, hi = rubric.scale
  example = json.dumps({c.name: int(hi) if hi.is_integer() else hi for c in rubric.criteria})
  values = dict(
    question=question,
    prediction=prediction,
    reference=reference,
    transcript=transcript,
    criteria=rubric.criteria,
    lo=_fmt(lo),
    hi=_fmt(hi),
    example=example,
  )
  return [
    {"role": "system", "content": _render(system_template, **values)},
    {"role": "user", "content": _render(user_template, **values)},
  ]


def group_messages(
  rubric: Rubric,
  *,
  question: str,
  predictions: Sequence[str],
  reference: str = "",
  system_template: str = GROUP_SYSTEM,
  user_template: str = GROUP_USER,
) -> list[dict]:
  """The chat messages asking the judge to rank `predictions` (labelled "1".."G") on `rubric`."""
  values = dict(
    question=question, reference=reference, criteria=rubric.criteria, responses=list(predictions), n=len(predictions)
  )
  return [
    {"role": "system", "content": _render(system_template, **values)},
    {"role": "user", "content": _render(user_template, **values)},
  ]


def _fmt(x: float) -> str:
  return str(int(x)) if float(x).is_integer() else str(x)


def scores_schema(rubric: Rubric) -> dict:
  """The JSON schema of a per-chain reply: {"scores": {criterion: number on the scale}} (integers when both ends
  of the scale are)."""
  lo, hi = rubric.scale
  integral = lo.is_integer() and hi.is_integer()
  number = {"type": "integer", "minimum": int(lo), "maximum": int(hi)} if integral else {"type": "number"}
  if not integral:
    number.update(minimum=lo, maximum=hi)
  names = [c.name for c in rubric.criteria]
  scores = {
    "type": "object",
    "properties": {n: number for n in names},
    "required": names,
    "additionalProperties": False,
  }
  return {"type": "object", "properties": {"scores": scores}, "required": ["scores"], "additionalProperties": False}


def ranking_schema(n: int) -> dict:
  """The JSON schema of a group reply: {"ranking": [n labels "1".."n"]} (ties and repeats are not excluded by it:
  `parse_ranking` checks the permutation)."""
  labels = {"type": "string", "enum": [str(i + 1) for i in range(n)]}
  ranking = {"type": "array", "items": labels, "minItems": n, "maxItems": n}
  return {"type": "object", "properties": {"ranking": ranking}, "required": ["ranking"], "additionalProperties": False}


def last_json_object(text: str) -> dict | None:
  """The last top-level JSON object in `text` (judges wrap it in prose or ``` fences), or None."""
  decoder = json.JSONDecoder()
  found, i = None, text.find("{")
  while i != -1:
    try:
      obj, end = decoder.raw_decode(text, i)
    except ValueError:
      i = text.find("{", i + 1)
      continue
    if isinstance(obj, dict):
      found = obj
    i = text.find("{", end)
  return found


def _number(x) -> float | None:
  if isinstance(x, bool) or not isinstance(x, numbers.Real):
    return None
  x = float(x)
  return x if math.isfinite(x) else None


def parse_scores(text: str, rubric: Rubric) -> dict[str, float] | None:
  """{criterion: score} of a per-chain reply ({"scores": {...}}, a bare {...}, or {"score": x} for a one-criterion
  rubric), every criterion a number on the scale; None otherwise."""
  obj = last_json_object(text or "")
  if obj is None:
    return None
  scores = obj.get("scores", obj)
  if not isinstance(scores, dict):
    return None
  if len(rubric.criteria) == 1 and rubric.criteria[0].name not in scores and "score" in scores:
    scores = {rubric.criteria[0].name: scores["score"]}
  lo, hi = rubric.scale
  out = {}
  for c in rubric.criteria:
    value = _number(scores.get(c.name))
    if value is None or not lo <= value <= hi:
      return None
    out[c.name] = value
  return out


def rubric_score(rubric: Rubric, scores: dict[str, float]) -> float:
  """The weighted mean of `scores` mapped from the scale to [0, 1]."""
  lo, hi = rubric.scale
  total = sum(c.weight for c in rubric.criteria)
  return sum(c.weight * (scores[c.name] - lo) / (hi - lo) for c in rubric.criteria) / total


def parse_ranking(text: str, n: int) -> list[list[int]] | None:
  """The ranking of a group reply as blocks of tied 0-based indices, best first ({"ranking": ["2", ["1", "3"]]}
  -> [[1], [0, 2]]); labels "1".."n" as strings or integers, each exactly once; None otherwise."""
  obj = last_json_object(text or "")
  ranking = obj.get("ranking") if obj is not None else None
  if not isinstance(ranking, list):
    return None
  blocks, seen = [], set()
  for item in ranking:
    labels = item if isinstance(item, list) else [item]
    block = []
    for label in labels:
      if isinstance(label, bool):
        return None
      try:
        index = int(str(label).strip()) - 1
      except ValueError:
        return None
      if not 0 <= index < n or index in seen:
        return None
      seen.add(index)
      block.append(index)
    if not block:
      return None
    blocks.append(block)
  return blocks if len(seen) == n else None


def rank_scores(blocks: Sequence[Sequence[int]], n: int) -> list[float]:
  """Scores in [0, 1] of the n ranked responses (see the module docstring): position p -> 1 - p / (n - 1), a
  tied block sharing its mean position; n == 1 -> [1.0]."""
  if n == 1:
    return [1.0]
  out = [0.0] * n
  position = 0
  for block in blocks:
    mean_position = position + (len(block) - 1) / 2
    for index in block:
      out[index] = 1.0 - mean_position / (n - 1)
    position += len(block)
  return out
