"""`config.judge`: a judge model's reward (rewards/judge.py), typed; built into the task by tasks/judged.py.

    --config.judge.url=http://127.0.0.1:8000/v1 --config.judge.criteria='correct: the answer is right'
    --config.judge.pretrained=/path/to/hf_judge      # or: run the judge in this process on its own sampler
    --config.judge.mode=group                        # the chains of a row ranked together (RULER-style)

Off while both `url` and `pretrained` are "". With a rule reward in the task, the reward trained on is
`weight` x judge + (1 - weight) x rule (the rule's value logged as rule/reward); a task with no rule reward
(a user task with no config.task.reward) is scored by the judge alone.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from agentfly_jax.rl.spec_section import Section, fail

JUDGE_MODES = ("chain", "group")


@dataclasses.dataclass(frozen=True)
class JudgeSection(Section):
  NAME: ClassVar[str] = "judge"
  url: str = ""  # an OpenAI-compatible base URL (ending in /v1); probed before training
  model: str = ""  # the model to ask there ("" = the first the server lists)
  api_key_env: str = ""  # the environment variable holding the server's API key ("" = none; never the key here)
  pretrained: str = ""  # or: an HF folder run in this process on its own JAX sampler
  mode: str = "chain"  # chain: each chain scored on the rubric | group: a row's chains ranked together
  criteria: tuple[str, ...] = ()  # the rubric: "name: what it asks", one per criterion
  weights: tuple[float, ...] = ()  # one per criterion (() = equal)
  scale_min: float = 0.0  # the scale the judge scores each criterion on
  scale_max: float = 10.0
  reference_field: str = ""  # a row field shown to the judge as the reference answer ("" = none)
  show_transcript: bool = False  # the chain's whole conversation in the judge's prompt (chain mode)
  weight: float = 1.0  # the judge's share of the reward when the task has a rule reward
  unparsed_score: float = 0.0  # the score of a reply that does not parse (counted: judge/unparsed)
  max_concurrency: int = 16  # judge calls in flight at once
  judge_timeout_s: float = 120.0  # per attempt of a judge call
  retries: int = 2  # more attempts after a failed one (then the chain fails)
  cache_size: int = 4096  # replies kept (the same prompt is judged once); 0 = off
  temperature: float = 0.0
  max_tokens: int = 256  # of the judge's reply
  json_mode: bool = False  # url: ask for a JSON-object reply (response_format)

  @property
  def enabled(self) -> bool:
    return bool(self.url or self.pretrained)

  def check(self):
    self.need("mode", self.mode in JUDGE_MODES, f"must be one of {JUDGE_MODES}")
    if self.url and self.pretrained:
      fail(
        "judge.pretrained", self.pretrained, "judge.url is set too; a judge is served at a URL or run here, not both"
      )
    self.need("weight", 0 <= self.weight <= 1, "must be in [0, 1] (the judge's share of the reward)")
    for name, low in (("max_concurrency", 1), ("retries", 0), ("cache_size", 0), ("max_tokens", 1)):
      self.at_least(name, low)
    self.need("judge_timeout_s", 0 < self.judge_timeout_s < float("inf"), "must be a number of seconds > 0")
    self.need("temperature", self.temperature >= 0, "must be >= 0")
    if self.weights:
      self.need(
        "weights", len(self.weights) == len(self.criteria), f"needs one weight per criterion ({len(self.criteria)})"
      )
    if self.enabled:
      self.rubric()

  def rubric(self):
    """The rubric (rewards/rubric.Rubric) of `criteria`, `weights` and the scale; ValueError naming the field."""
    from agentfly_jax.rewards.rubric import Criterion, Rubric

    criteria = []
    for i, text in enumerate(self.criteria):
      name, sep, description = text.partition(":")
      if not sep or not name.strip() or not description.strip():
        fail("judge.criteria", self.criteria, f"criterion {i} {text!r} must read 'name: what it asks'")
      weight = self.weights[i] if self.weights else 1.0
      criteria.append(Criterion(name.strip(), description.strip(), weight))
    try:
      return Rubric(tuple(criteria), (self.scale_min, self.scale_max), where=f"config.judge.criteria={self.criteria!r}")
    except ValueError as e:
      raise ValueError(str(e)) from None
