"""Judge rewards: the ranking-to-score map and rubric scores on hand-worked cases, reply parsing, the call
policy (cache, in-flight dedupe, retries, timeout, concurrency limit) against a loopback OpenAI-compatible
server, and judge rewards inside the rollout (per chain while other chains still run; a group ranked when its
last chain ends)."""

import json
import re
import time

import pytest
import trio

from agent_testlib import agent_tokenizer, tokenizer_dir
from judge_server import JudgeServer, group_responses, response_text
from agentfly_jax.agents import ToolCallAgent, run_rollout
from agentfly_jax.rewards import exact_match
from agentfly_jax.rewards.judge import judge_reward
from agentfly_jax.rewards.judge_client import JudgeCalls, JudgeError, OpenAIJudge, check_url
from agentfly_jax.rewards.rubric import (
  Criterion,
  Rubric,
  chain_messages,
  parse_ranking,
  parse_scores,
  rank_scores,
  rubric_score,
)
from agentfly_jax.sampling.scripted import ScriptedSampler

RUBRIC = Rubric((Criterion("correct", "the answer is right", weight=2.0), Criterion("concise", "few words")), (0, 10))
ONE = Rubric((Criterion("quality", "how good the answer is"),), (1, 5))


# ------------------------------------------------------------------ definitions, by hand
@pytest.mark.parametrize(
  "blocks, n, want",
  [
    ([[1], [0], [3], [2]], 4, [2 / 3, 1.0, 0.0, 1 / 3]),  # positions 1, 0, 3, 2 -> 1 - p / 3
    ([[0, 1], [2]], 3, [0.75, 0.75, 0.0]),  # a tie at positions 0, 1: mean 0.5 -> 1 - 0.5 / 2
    ([[0, 1, 2]], 3, [0.5, 0.5, 0.5]),  # all tied: mean position 1 of 0..2
    ([[4], [0, 2, 3], [1]], 5, [0.5, 0.0, 0.5, 0.5, 1.0]),  # block at 1..3: mean 2 -> 1 - 2 / 4
    ([[0]], 1, [1.0]),
  ],
)
def test_rank_scores_hand_worked(blocks, n, want):
  got = rank_scores(blocks, n)
  assert got == pytest.approx(want)
  assert sum(got) / n == pytest.approx(0.5 if n > 1 else 1.0)


@pytest.mark.parametrize(
  "text, want",
  [
    ('{"ranking": ["2", ["1", "3"]]}', [[1], [0, 2]]),
    ('I compared them.\n```json\n{"ranking": [3, 1, 2]}\n```', [[2], [0], [1]]),
    ('{"note": {"x": 1}} then {"ranking": ["1", "2", "3"]}', [[0], [1], [2]]),
    ('{"ranking": ["1", "1", "2"]}', None),  # a label twice
    ('{"ranking": ["1", "2"]}', None),  # one missing
    ('{"ranking": ["1", "2", "4"]}', None),  # no response 4
    ('{"ranking": [true, "2", "3"]}', None),
    ('{"ranking": ["1", [], "2", "3"]}', None),
    ("1 > 2 > 3", None),
  ],
)
def test_parse_ranking(text, want):
  assert parse_ranking(text, 3) == want


def test_rubric_scores_hand_worked_and_bad_replies():
  reply = 'Sure.\n```json\n{"scores": {"correct": 8, "concise": 5}, "why": "ok"}\n```'
  scores = parse_scores(reply, RUBRIC)
  assert scores == {"correct": 8.0, "concise": 5.0}
  assert rubric_score(RUBRIC, scores) == pytest.approx((2 * 0.8 + 1 * 0.5) / 3)
  assert parse_scores('{"correct": 10, "concise": 0}', RUBRIC) == {"correct": 10.0, "concise": 0.0}  # bare object
  assert parse_scores('{"scores": {"correct": 11, "concise": 5}}', RUBRIC) is None  # off the scale
  assert parse_scores('{"scores": {"correct": 8}}', RUBRIC) is None  # a criterion missing
  assert parse_scores('{"scores": {"correct": "8", "concise": 5}}', RUBRIC) is None
  assert parse_scores("eight out of ten", RUBRIC) is None
  assert parse_scores('{"score": 4}', ONE) == {"quality": 4.0}  # one criterion: "score" too
  assert rubric_score(ONE, {"quality": 4.0}) == pytest.approx(0.75)  # (4 - 1) / (5 - 1)


def test_bad_rubrics_are_named():
  with pytest.raises(ValueError, match="config.judge.criteria: a rubric needs at least one criterion"):
    Rubric((), where="config.judge.criteria")
  with pytest.raises(ValueError, match="distinct"):
    Rubric((Criterion("a", "x"), Criterion("a", "y")))
  with pytest.raises(ValueError, match="weight 0"):
    Rubric((Criterion("a", "x", weight=0),))
  with pytest.raises(ValueError, match="lo < hi"):
    Rubric((Criterion("a", "x"),), scale=(5, 5))


def test_prompt_renders_the_rubric_and_refuses_unknown_names():
  msgs = chain_messages(RUBRIC, question="What is 2+2?", prediction="4", reference="four")
  system, user = msgs[0]["content"], msgs[1]["content"]
  assert "from 0 to 10" in system and '{"correct": 10, "concise": 10}' in system
  assert "What is 2+2?" in user and "Reference answer:\nfour" in user and "Response to judge:\n4" in user
  assert "- correct (weight 2.0): the answer is right" in user and "- concise (weight 1.0): few words" in user
  assert "Reference" not in chain_messages(RUBRIC, question="q", prediction="p")[1]["content"]
  with pytest.raises(Exception, match="undefined"):
    chain_messages(RUBRIC, question="q", prediction="p", user_template="{{ no_such_name }}")


# ------------------------------------------------------------------ the call policy, on a loopback server
def _scores_reply(messages):
  good = "right" in response_text(messages)
  return json.dumps({"scores": {"correct": 10 if good else 2, "concise": 6}})


def _msgs(text):
  return chain_messages(RUBRIC, question="q", prediction=text)


def test_cache_and_in_flight_requests_call_once():
  with JudgeServer(_scores_reply, delay_s=0.2) as server:
    calls = JudgeCalls(OpenAIJudge(server.base_url, "judge"), retries=0)

    async def both():  # two equal requests at once: one sent, one waits for its reply
      a, b = [], []

      async def one(out):
        out.append(await calls.reply(_msgs("right")))

      async with trio.open_nursery() as n:
        n.start_soon(one, a)
        n.start_soon(one, b)
      return a[0], b[0]

    first, second = trio.run(both)
    assert len(server.requests) == 1
    assert first[0] == second[0] and sorted([first[1], second[1]]) == [False, True]
    again = trio.run(calls.reply, _msgs("right"))  # a later run: from the cache
    assert again == (first[0], True) and len(server.requests) == 1
    trio.run(calls.reply, _msgs("wrong"))  # another prediction: its own request
    assert len(server.requests) == 2 and calls.hits == 2 and calls.calls == 2


def test_retries_then_success_and_failure_after_every_attempt():
  with JudgeServer(_scores_reply, fail_first=2) as server:
    calls = JudgeCalls(OpenAIJudge(server.base_url, "judge"), retries=2, backoff_s=0.01)
    text, cached = trio.run(calls.reply, _msgs("right"))
    assert not cached and json.loads(text)["scores"]["correct"] == 10
    assert len(server.requests) == 3 and calls.failures == 2
  with JudgeServer(_scores_reply, fail_first=10) as server:
    calls = JudgeCalls(OpenAIJudge(server.base_url, "judge"), retries=1, backoff_s=0.01)
    with pytest.raises(JudgeError, match="2 attempts failed.*500"):
      trio.run(calls.reply, _msgs("right"))
    assert len(server.requests) == 2


def test_timeout_is_per_attempt():
  with JudgeServer(_scores_reply, delay_s=5.0) as server:
    calls = JudgeCalls(OpenAIJudge(server.base_url, "judge"), timeout_s=0.2, retries=1, backoff_s=0.01)
    start = time.perf_counter()
    with pytest.raises(JudgeError, match="timeout_s=0.2"):
      trio.run(calls.reply, _msgs("right"))
    assert time.perf_counter() - start < 4.0  # two cut attempts, not two 5 s replies
    assert calls.calls == 2 and calls.failures == 2  # (a loaded machine may cut the second before it is sent)


def test_concurrency_limit_holds_at_the_server():
  with JudgeServer(_scores_reply, delay_s=0.15) as server:
    calls = JudgeCalls(OpenAIJudge(server.base_url, "judge"), max_concurrency=2)

    async def main():
      async with trio.open_nursery() as n:
        for i in range(6):
          n.start_soon(calls.reply, _msgs(f"answer {i}"))

    trio.run(main)
    assert len(server.requests) == 6 and server.max_in_flight == 2


def test_check_url_names_the_field():
  with pytest.raises(ValueError, match=r"config.judge.url='http://127.0.0.1:9/v1': no OpenAI-compatible server"):
    check_url("http://127.0.0.1:9/v1", "", field="judge.url", model_field="judge.model")
  with JudgeServer(_scores_reply, model="big-judge") as server:
    assert check_url(server.base_url, "", field="judge.url", model_field="judge.model") == "big-judge"
    with pytest.raises(ValueError, match=r"config.judge.model='other'.*serves \['big-judge'\]"):
      check_url(server.base_url, "other", field="judge.url", model_field="judge.model")


# ------------------------------------------------------------------ judge rewards alone
def test_chain_reward_unparsed_is_a_metric_and_a_score_and_mixes_with_a_rule():
  replies = {"right": '{"scores": {"correct": 9, "concise": 3}}', "wrong": "I cannot decide."}
  with JudgeServer(lambda m: replies[response_text(m)]) as server:
    calls = JudgeCalls(OpenAIJudge(server.base_url, "judge"))
    r = judge_reward(calls, RUBRIC, unparsed_score=-1.0, reference_field="answer")
    row = {"question": "q", "answer": "right"}
    good = trio.run(r.compute, "right", [], row)
    assert good["reward"] == pytest.approx((2 * 0.9 + 0.3) / 3)
    assert good["judge/unparsed"] == 0.0 and good["judge/correct"] == 9.0
    bad = trio.run(r.compute, "wrong", [], row)
    assert bad["reward"] == -1.0 and bad["judge/unparsed"] == 1.0
    assert "Reference answer:\nright" in server.requests[0][1][1]["content"]
    mixed = judge_reward(calls, RUBRIC, base=exact_match, weight=0.25, reference_field="answer")
    m = trio.run(mixed.compute, "right", [], row)  # the same prompt: from the cache
    assert m["judge/cache_hit"] == 1.0 and m["rule/reward"] == 1.0
    assert m["reward"] == pytest.approx(0.25 * good["reward"] + 0.75 * 1.0)
    with pytest.raises(KeyError, match="reference field 'answer'"):
      r.bind("x", [], {"question": "q"})
  with pytest.raises(ValueError, match="none \\(base\\) is given"):
    judge_reward(calls, RUBRIC, weight=0.5)


# ------------------------------------------------------------------ inside the rollout
class _TimedSampler(ScriptedSampler):
  """Replies by the row's question; the 'slow' row's turns take `slow_s`; records when each reply returned."""

  def __init__(self, script, slow_s):
    super().__init__(script)
    self.slow_s, self.returned = slow_s, []

  async def agenerate(self, prompt, params):
    if "slow" in agent_tokenizer().decode(prompt):
      await trio.sleep(self.slow_s)
    result = await super().agenerate(prompt, params)
    self.returned.append(time.perf_counter())
    return result


def _agent(reward_fn):
  return ToolCallAgent(tokenizer_dir(), tools=[], reward_fn=reward_fn, system_prompt="Answer.")


def test_chain_judging_runs_while_other_chains_still_roll_out():
  tok = agent_tokenizer()
  sampler = _TimedSampler(lambda prompt: tok.encode("right<|im_end|>"), slow_s=2.0)
  with JudgeServer(_scores_reply) as server:
    r = judge_reward(JudgeCalls(OpenAIJudge(server.base_url, "judge")), RUBRIC)
    rows = [{"question": "fast one"}, {"question": "slow one"}]
    trajs = run_rollout(_agent(r), rows, sampler=sampler, num_chains=2, max_turns=1)
    first_judged = server.requests[0][0]
    assert first_judged < max(sampler.returned) - 1.0  # judged well before the slow chains ended
    assert [t.reward for t in trajs] == pytest.approx([(2 * 1.0 + 0.6) / 3] * 4)
    assert len(server.requests) == 2  # one per distinct prompt: the chains of a row share theirs (cache)


def _rank_by_quality(messages):
  responses = group_responses(messages)
  qualities = [int(re.search(r"quality (\d)", r).group(1)) for r in responses]
  order = sorted(range(len(responses)), key=lambda i: -qualities[i])
  return json.dumps({"ranking": [str(i + 1) for i in order]})


def test_group_judging_ranks_a_rows_chains_once_they_all_end():
  tok = agent_tokenizer()
  replies = [tok.encode(f"quality {q}<|im_end|>") for q in (3, 1, 4, 2)]
  with JudgeServer(_rank_by_quality) as server:
    r = judge_reward(JudgeCalls(OpenAIJudge(server.base_url, "judge")), ONE, group=True)
    trajs = run_rollout(  # concurrency < chains: a group waits for its reward outside the chain limiter
      _agent(r), [{"question": "rank us"}], sampler=ScriptedSampler(replies), num_chains=4, concurrency=2
    )
    assert len(server.requests) == 1 and "Response 4:" in server.requests[0][1][1]["content"]
    for t in trajs:  # rank_scores: quality 4 first (1), then 3 (2/3), 2 (1/3), 1 (0)
      q = int(re.search(r"quality (\d)", t.prediction).group(1))
      assert t.reward == pytest.approx((q - 1) / 3), (t.prediction, t.reward)
      assert t.reward_metrics["judge/unparsed"] == 0.0
    # one chain (a greedy eval): scored on the rubric per chain
    with JudgeServer(lambda m: '{"score": 5}') as single:
      r1 = judge_reward(JudgeCalls(OpenAIJudge(single.base_url, "judge")), ONE, group=True)
      (t,) = run_rollout(_agent(r1), [{"question": "alone"}], sampler=ScriptedSampler(replies), num_chains=1)
      assert t.reward == 1.0 and "Response to judge" in single.requests[0][1][1]["content"]


def test_group_reply_that_does_not_parse_scores_every_chain_the_configured_value():
  tok = agent_tokenizer()
  replies = [tok.encode(f"quality {q}<|im_end|>") for q in (3, 1)]
  with JudgeServer(lambda m: '{"ranking": ["1", "1"]}') as server:
    r = judge_reward(JudgeCalls(OpenAIJudge(server.base_url, "judge")), ONE, group=True, unparsed_score=0.25)
    trajs = run_rollout(_agent(r), [{"question": "q"}], sampler=ScriptedSampler(replies), num_chains=2)
    assert [t.reward for t in trajs] == [0.25, 0.25]
    assert all(t.reward_metrics["judge/unparsed"] == 1.0 and t.error is None for t in trajs)


def test_a_judge_that_is_gone_fails_the_chains_not_the_rollout():
  tok = agent_tokenizer()
  calls = JudgeCalls(OpenAIJudge("http://127.0.0.1:9/v1", "judge"), retries=1, backoff_s=0.01)
  for group in (False, True):
    r = judge_reward(calls, ONE, group=group)
    sampler = ScriptedSampler([tok.encode("quality 2<|im_end|>")])
    trajs = run_rollout(_agent(r), [{"question": "q"}], sampler=sampler, num_chains=2)
    assert all(t.finish_reason == "error" and "JudgeError" in t.error and t.reward == 0 for t in trajs)
