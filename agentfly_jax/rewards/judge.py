"""Judge rewards: a judge model scores a chain on a rubric, or ranks a row's chains together (RULER-style).

    calls = JudgeCalls(OpenAIJudge(url, model="judge"), max_concurrency=8, timeout_s=60, retries=2)
    r = judge_reward(calls, rubric)                        # per chain: an ordinary @reward (async)
    r = judge_reward(calls, rubric, group=True)            # the G chains of a row ranked together
    r = judge_reward(calls, rubric, base=exact_match, weight=0.5)   # mixed: 0.5 judge + 0.5 rule

Per chain, the reward is computed inside the chain as soon as it finishes, like every reward: the judge's
calls overlap the chains still rolling out. A group reward (`group=True`, `Reward.group`) is computed when the
last chain of its group finishes (agents/rollout_driver.drive_chains' `on_group`), while other groups still
run; a "group" of one chain (a greedy evaluation) is scored per chain on the rubric instead. The rubric, the
scale and the maps to [0, 1] are rewards/rubric.py's.

What the judge sees: the row's `question`, the prediction, the reference (the row's `reference_field`, a
reward-only field the agent never saw; "" = none) and, with `show_transcript`, the chain's messages. A reply
that does not parse scores `unparsed_score` with metric judge/unparsed = 1; a call that fails every retry
raises (rewards/judge_client.JudgeError: the chain fails). Metrics per chain: judge/score (the judge's [0, 1]
score), judge/unparsed, judge/cache_hit, judge/<criterion> (per-chain scoring), rule/reward (with `base`).
"""

from __future__ import annotations

import json
from typing import Sequence

from agentfly_jax.rewards.judge_client import JudgeCalls
from agentfly_jax.rewards.reward import Reward, normalize_reward
from agentfly_jax.rewards.rubric import (
  CHAIN_SYSTEM,
  CHAIN_USER,
  GROUP_SYSTEM,
  GROUP_USER,
  Rubric,
  chain_messages,
  group_messages,
  parse_ranking,
  parse_scores,
  rank_scores,
  ranking_schema,
  rubric_score,
  scores_schema,
)


def transcript_text(messages: Sequence[dict]) -> str:
  """The chain's messages as plain text, one "role: content" block each (tool calls as JSON)."""
  lines = []
  for m in messages:
    content = m.get("content")
    if not isinstance(content, str):
      content = json.dumps(content)
    calls = m.get("tool_calls")
    lines.append(f"{m.get('role', '?')}: {content}" + (f"\n  tool calls: {json.dumps(calls)}" if calls else ""))
  return "\n".join(lines)


class JudgeReward(Reward):
  """A per-chain judge reward (see the module docstring); `group` False."""

  group = False

  def __init__(
    self,
    calls: JudgeCalls,
    rubric: Rubric,
    *,
    name: str = "judge",
    unparsed_score: float = 0.0,
    reference_field: str = "",
    show_transcript: bool = False,
    base: Reward | None = None,
    weight: float = 1.0,
    templates: dict | None = None,
  ):
    if not isinstance(rubric, Rubric):
      raise TypeError(f"judge_reward: rubric must be a rewards.rubric.Rubric, got {type(rubric).__name__}")
    if not 0 <= weight <= 1:
      raise ValueError(f"judge_reward: weight must be in [0, 1] (the judge's share of the reward), got {weight!r}")
    if base is None and weight != 1:
      raise ValueError(f"judge_reward: weight={weight!r} mixes the judge with a rule reward, and none (base) is given")
    if base is not None and not isinstance(base, Reward):
      base = Reward(base)
    self.calls, self.rubric, self.unparsed_score = calls, rubric, float(unparsed_score)
    self.reference_field, self.show_transcript = reference_field, show_transcript
    self.base, self.weight = base, float(weight)
    self.templates = {
      "chain_system": CHAIN_SYSTEM,
      "chain_user": CHAIN_USER,
      "group_system": GROUP_SYSTEM,
      "group_user": GROUP_USER,
      **(templates or {}),
    }
    env = base.env_name if base is not None else None

    if env is None:

      async def judge(prediction, trajectory, row):
        return await self.score_chain(prediction, trajectory, row, None)
    else:

      async def judge(prediction, trajectory, row, env):
        return await self.score_chain(prediction, trajectory, row, env)

    judge.__name__ = name
    super().__init__(judge, name=name, env=env)

  def _reference(self, row: dict) -> str:
    if not self.reference_field:
      return ""
    if self.reference_field not in row:
      raise KeyError(f"judge reward '{self.name}': reference field '{self.reference_field}' is not in the row")
    return str(row[self.reference_field])

  def bind(self, prediction, trajectory, row, env=None) -> dict:
    kwargs = super().bind(prediction, trajectory, row, env)
    self._reference(row)  # validate_rows: a row without the reference field is refused before the rollout
    if self.base is not None:
      self.base.bind(prediction, trajectory, row, env)
    return kwargs

  async def judge_chain(self, prediction, trajectory, row) -> dict:
    """{"reward": the judge's [0, 1] score, judge/* metrics} of one chain on the rubric."""
    messages = chain_messages(
      self.rubric,
      question=str(row.get("question", "")),
      prediction=str(prediction or ""),
      reference=self._reference(row),
      transcript=transcript_text(trajectory) if self.show_transcript else "",
      system_template=self.templates["chain_system"],
      user_template=self.templates["chain_user"],
    )
    text, cached = await self.calls.reply(messages, scores_schema(self.rubric))
    scores = parse_scores(text, self.rubric)
    out = {"judge/unparsed": float(scores is None), "judge/cache_hit": float(cached)}
    if scores is None:
      out["reward"] = self.unparsed_score
    else:
      out["reward"] = rubric_score(self.rubric, scores)
      out.update({f"judge/{k}": v for k, v in scores.items()})
    return out

  async def mix(self, judged: dict, prediction, trajectory, row, env) -> dict:
    """`judged` ({"reward": judge score, judge/*}) mixed with the base rule reward: weight x judge + (1 - weight)
    x rule; the rule's own metrics kept, its value as rule/reward."""
    out = {**judged, "judge/score": judged["reward"]}
    if self.base is None:
      return out
    rule = await self.base.compute(prediction, trajectory, row, env)
    out.update({k: v for k, v in rule.items() if k != "reward"})
    out["rule/reward"] = rule["reward"]
    out["reward"] = self.weight * judged["reward"] + (1 - self.weight) * rule["reward"]
    return out

  async def score_chain(self, prediction, trajectory, row, env) -> dict:
    judged = await self.judge_chain(prediction, trajectory, row)
    return await self.mix(judged, prediction, trajectory, row, env)


class GroupJudgeReward(JudgeReward):
  """The G chains of one row ranked together by the judge (see the module docstring); `group` True: the
  rollout calls `compute_group` once per group instead of `compute` per chain."""

  group = True

  def __init__(self, calls: JudgeCalls, rubric: Rubric, **kwargs):
    super().__init__(calls, rubric, **kwargs)
    if self.env_name is not None:
      raise ValueError(f"judge_reward(group=True): base reward {self.base.name!r} needs an environment; not in groups")

  async def compute_group(self, predictions: Sequence, trajectories: Sequence[list], row: dict) -> list[dict]:
    """One {"reward": ..., metrics} per prediction (chains of one row, in order)."""
    n = len(predictions)
    if n == 1:
      judged = [await self.judge_chain(predictions[0], trajectories[0], row)]
    else:
      messages = group_messages(
        self.rubric,
        question=str(row.get("question", "")),
        predictions=[str(p or "") for p in predictions],
        reference=self._reference(row),
        system_template=self.templates["group_system"],
        user_template=self.templates["group_user"],
      )
      text, cached = await self.calls.reply(messages, ranking_schema(n))
      blocks = parse_ranking(text, n)
      scores = [self.unparsed_score] * n if blocks is None else rank_scores(blocks, n)
      judged = [
        {"reward": s, "judge/unparsed": float(blocks is None), "judge/cache_hit": float(cached)} for s in scores
      ]
    out = []
    for p, t, j in zip(predictions, trajectories, judged):
      out.append(normalize_reward(self.name, await self.mix(j, p, t, row, None)))
    return out


def judge_reward(calls: JudgeCalls, rubric: Rubric, *, group: bool = False, **kwargs) -> JudgeReward:
  """A judge reward: per chain, or (`group`) the chains of a row ranked together. kwargs: name, unparsed_score,
  reference_field, show_transcript, base (a rule reward to mix in), weight (the judge's share), templates
  ({"chain_system" | "chain_user" | "group_system" | "group_user": jinja2 source})."""
  return (GroupJudgeReward if group else JudgeReward)(calls, rubric, **kwargs)
