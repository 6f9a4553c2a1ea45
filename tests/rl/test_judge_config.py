"""config.judge: parsed into the typed RunSpec (bad fields named), built into the task's reward by build_task
(the judge URL probed before anything is built; a rubric without criteria refused; the rule reward mixed in;
a user task with no rule reward scored by the judge alone)."""

import json

import pytest
import trio

from judge_server import JudgeServer, response_text
from agentfly_jax.rewards.judge import GroupJudgeReward, JudgeReward
from agentfly_jax.rl.config import default_config
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.tasks.from_config import build_task, set_custom_task

CRITERIA = ("correct: the answer is right", "concise: few words")


def _spec(task=None, **judge):
  c = default_config()
  if task is not None:
    set_custom_task(c, **task)
  c.judge.update(judge)
  return RunSpec.from_config(c)


@pytest.mark.parametrize(
  "judge, message",
  [
    (dict(url="http://x/v1"), r"config.judge.criteria=\(\): a rubric needs at least one criterion"),
    (dict(url="http://x/v1", criteria=("no colon",)), r"criterion 0 'no colon' must read 'name: what it asks'"),
    (dict(url="http://x/v1", criteria=CRITERIA, weights=(1.0,)), r"config.judge.weights=\(1.0,\): needs one weight"),
    (dict(url="http://x/v1", criteria=CRITERIA, weights=(1.0, 0.0)), "weight 0.0; weights must be numbers > 0"),
    (dict(url="http://x/v1", pretrained="/tmp/j", criteria=CRITERIA), "config.judge.pretrained='/tmp/j'.*not both"),
    (dict(mode="pairs"), r"config.judge.mode='pairs': must be one of \('chain', 'group'\)"),
    (dict(weight=1.5), r"config.judge.weight=1.5: must be in \[0, 1\]"),
    (dict(url="http://x/v1", criteria=CRITERIA, scale_min=5.0, scale_max=1.0), "lo < hi"),
  ],
)
def test_bad_judge_fields_are_named(judge, message):
  with pytest.raises(ValueError, match=message):
    _spec(**judge)


def test_off_by_default_and_in_the_default_config():
  spec = RunSpec.from_config(default_config())
  assert not spec.judge.enabled and spec.judge.mode == "chain"
  assert "judge" in default_config() and build_task(spec).reward.name != "judge"


def test_a_judge_url_that_does_not_answer_stops_the_build_naming_the_field():
  spec = _spec(url="http://127.0.0.1:9/v1", criteria=CRITERIA)
  with pytest.raises(ValueError, match=r"config.judge.url='http://127.0.0.1:9/v1': no OpenAI-compatible server"):
    build_task(spec)


def _reply(messages):
  return json.dumps({"scores": {"correct": 10 if "4" in response_text(messages) else 0, "concise": 10}})


def test_built_in_task_mixes_the_judge_with_its_rule_reward():
  with JudgeServer(_reply) as server:
    spec = _spec(url=server.base_url, criteria=CRITERIA, weight=0.5)
    task = build_task(spec)
    assert isinstance(task.reward, JudgeReward) and not isinstance(task.reward, GroupJudgeReward)
    rule = build_task(RunSpec.from_config(default_config())).reward
    assert task.reward.base.name == rule.name and task.reward.weight == 0.5
    row = task.make_rows(1, 0)[0]
    expected_rule = trio.run(rule.compute, "4", [], row)["reward"]
    got = trio.run(task.reward.compute, "4", [], row)
    assert got["rule/reward"] == expected_rule
    assert got["reward"] == pytest.approx(0.5 * 1.0 + 0.5 * expected_rule)
    from agent_testlib import agent_tokenizer

    assert task.make_agent(agent_tokenizer()).reward_fn is task.reward  # the task's own agent scores with the judge
    group = build_task(_spec(url=server.base_url, criteria=CRITERIA, mode="group"))
    assert isinstance(group.reward, GroupJudgeReward) and group.reward.weight == 1.0


def test_a_user_task_without_a_rule_reward_is_judged_alone(tmp_path):
  rows = tmp_path / "rows.json"
  rows.write_text(json.dumps([{"question": "2 + 2?", "answer": "4"}, {"question": "3 + 3?", "answer": "6"}]))
  task_fields = dict(train_path=str(rows), tools="answer")
  with pytest.raises(ValueError, match="config.task.reward is empty"):
    build_task(_spec(task=task_fields))  # no judge: a reward is required
  with JudgeServer(_reply) as server:
    task = build_task(_spec(task=task_fields, url=server.base_url, criteria=CRITERIA, reference_field="answer"))
    assert task.reward.base is None
    assert trio.run(task.reward.compute, "4", [], task.rows[0])["reward"] == 1.0
    assert "Reference answer:\n4" in server.requests[0][1][1]["content"]
    with pytest.raises(ValueError, match="config.judge.weight=0.5: the task has no rule reward"):
      build_task(_spec(task=task_fields, url=server.base_url, criteria=CRITERIA, weight=0.5))
    with pytest.raises(ValueError, match="config.judge.reference_field='gold': row 0 has no such field"):
      build_task(_spec(task=task_fields, url=server.base_url, criteria=CRITERIA, reference_field="gold"))
