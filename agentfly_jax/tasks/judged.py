"""A task scored by a judge model: `config.judge` (rl/judge_spec.JudgeSection) made into the task's reward.

    task = with_judge(spec, task)          # tasks/from_config.build_task calls it: every script gets the judge

The judge is reached at `judge.url` (probed here, before any model is built: a URL where nothing answers is an
error naming the field) or run in this process from the HF folder `judge.pretrained` on its own JAX sampler.
The task's rule reward, when it has one, is mixed in (`judge.weight`) and logged as rule/reward; a user task
without one (`NO_RULE`: no config.task.reward, no @reward in its module) is scored by the judge alone.
"""

from __future__ import annotations

import dataclasses
import os

from agentfly_jax.rewards.judge import JudgeReward, judge_reward
from agentfly_jax.rewards.judge_client import JudgeCalls, OpenAIJudge, check_url
from agentfly_jax.rewards.reward import Reward

IN_PROCESS_MAX_LEN = 4096  # the in-process judge's context: its prompt (rubric + responses) + its reply


def _no_rule(prediction):
  raise RuntimeError("this task has no rule reward: config.judge scores it (tasks/judged.py)")


NO_RULE = Reward(_no_rule, name="no_rule_reward")  # a user task with no reward of its own, scored by the judge


def judging(config) -> bool:
  """Whether `config` (a RunSpec, or a config dict with a `judge` section) turns a judge on: a URL or a folder."""
  if hasattr(config, "get"):  # a config dict (ml_collections or plain)
    section = config.get("judge") or {}
    return bool(section.get("url") or section.get("pretrained"))
  section = getattr(config, "judge", None)
  return bool(section is not None and section.enabled)


def judge_client(section):
  """The JudgeClient of `section`: an OpenAIJudge at its (probed) URL, or a SamplerJudge in this process."""
  if section.url:
    key = "EMPTY"
    if section.api_key_env:
      if section.api_key_env not in os.environ:
        raise ValueError(f"config.judge.api_key_env={section.api_key_env!r}: no such environment variable is set")
      key = os.environ[section.api_key_env]
    model = check_url(section.url, section.model, field="judge.url", model_field="judge.model", api_key=key)
    return OpenAIJudge(
      section.url,
      model,
      api_key=key,
      temperature=section.temperature,
      max_tokens=section.max_tokens,
      json_mode=section.json_mode,
    )
  return _in_process(section)


def _in_process(section):
  from agentfly_jax.agents.sampler_judge import SamplerJudge
  from agentfly_jax.models import from_pretrained
  from agentfly_jax.sampling import JaxSampler

  folder = section.pretrained
  if not os.path.isfile(os.path.join(folder, "config.json")) or not os.path.isfile(
    os.path.join(folder, "tokenizer.json")
  ):
    raise ValueError(
      f"config.judge.pretrained={folder!r}: not an HF folder (config.json + safetensors + tokenizer.json)"
    )
  model = from_pretrained(folder)
  sampler = JaxSampler(model, max_batch_size=section.max_concurrency, max_len=IN_PROCESS_MAX_LEN)
  return SamplerJudge(
    sampler,
    folder,
    name=os.path.abspath(folder),
    temperature=section.temperature,
    max_tokens=section.max_tokens,
  )


def _check_reference(section, task) -> None:
  field = section.reference_field
  if not field:
    return
  rows = list(task.rows) or task.make_rows(4, 0)
  for i, row in enumerate(rows):
    if field not in row:
      raise ValueError(f"config.judge.reference_field={field!r}: row {i} has no such field (its fields: {sorted(row)})")


def with_judge(config, task):
  """`task` (a TaskSpec) with `config.judge`'s reward, or as it is when no judge is on (or it has one)."""
  if not judging(config) or isinstance(task.reward, JudgeReward):
    return task
  section = config.judge
  base = None if task.reward is NO_RULE else task.reward
  if base is None and section.weight != 1:
    raise ValueError(
      f"config.judge.weight={section.weight!r}: the task has no rule reward to mix in; the judge alone is weight 1"
    )
  if section.mode == "group" and task.agent_fn is not None:
    raise ValueError(
      "config.judge.mode='group': a black-box agent's chains (config.task.agent) are scored one by one; use 'chain'"
    )
  _check_reference(section, task)
  rubric = section.rubric()
  calls = JudgeCalls(
    judge_client(section),
    max_concurrency=section.max_concurrency,
    timeout_s=section.judge_timeout_s,
    retries=section.retries,
    cache_size=section.cache_size,
  )
  reward = judge_reward(
    calls,
    rubric,
    group=section.mode == "group",
    unparsed_score=section.unparsed_score,
    reference_field=section.reference_field,
    show_transcript=section.show_transcript,
    base=base,
    weight=section.weight if base is not None else 1.0,
  )
  factory = task.agent_factory
  if factory is not None:  # a task's own agent carries its rule reward: the judge's replaces it there too
    task = dataclasses.replace(task, agent_factory=lambda tokenizer: _judged_agent(factory(tokenizer), reward))
  return dataclasses.replace(task, reward=reward)


def _judged_agent(agent, reward):
  agent.reward_fn = reward
  return agent
