"""No agent kind receives a row's reward-only fields (data/row_fields.py): a built-in agent that writes
every field it gets into its prompt, an agent_fn that sends its whole row to the model, and an outside
harness that dumps its environment, argv and stdin; each time the answer and the hidden tests are looked
for in everything the agent received, while the reward still reads them."""

import json
import os
import sys

import pytest

from agentfly_jax import reward
from agentfly_jax.agents import load_tokenizer, run_rollout
from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
from agentfly_jax.agents.harness import command_agent
from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS, agent_view, check_reward_only
from agentfly_jax.rl import stages
from agentfly_jax.rl.spec import RolloutSection
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import lookup

from endpoint_testlib import WARMSTART, lookup_script
from envservers_helpers import sandbox_unavailable_reason

HOSTILE = os.path.join(os.path.dirname(__file__), "harness_hostile.py")
SECRET, TESTS, GOLD = "zq81-secret-answer", "assert f() == 'hidden-tests-x9'", "gold-path-k3"
ROW = {"question": 'Find the code of key "fox".', "key": "fox", "answer": SECRET, "tests": TESTS, "gold": GOLD}


@reward(name="saw_secret")
def saw_secret(prediction, answer, tests):
  """1 when the reward got the row's reward-only fields (the agent must not have)."""
  return float(answer == SECRET and tests == TESTS)


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(WARMSTART)


@pytest.fixture(scope="module")
def leaky_agent(tok):
  """The lookup agent, made to write every row field it is given into its prompt and to record the rows."""
  agent = lookup.make_agent(tok)
  agent.reward_fn = saw_secret
  agent.rows_seen = []
  base_initial, base_tools = agent.initial_messages, agent.tools_for_row

  def initial_messages(row, tools, first_observation=None):
    agent.rows_seen.append(dict(row))
    messages = base_initial(row, tools, first_observation)
    messages[-1]["content"] += "\n" + json.dumps(row)
    return messages

  def tools_for_row(row):
    agent.rows_seen.append(dict(row))
    return base_tools(row)

  agent.initial_messages, agent.tools_for_row = initial_messages, tools_for_row
  return agent


def _assert_unseen(text: str, *secrets):
  for s in secrets:
    assert s not in text, f"{s!r} reached the agent"


def test_a_builtin_agent_never_gets_the_reward_only_fields(tok, leaky_agent):
  leaky_agent.rows_seen.clear()
  sampler = ScriptedSampler(lookup_script(tok))
  [t] = run_rollout(leaky_agent, [ROW], sampler=sampler)
  assert t.reward == 1.0  # the reward read answer and tests
  assert t.row == ROW  # the trainer's record keeps the whole row
  seen = json.dumps(leaky_agent.rows_seen) + json.dumps(t.messages)
  seen += "".join(tok.decode(prompt) for prompt, _ in sampler.calls)
  assert '"key": "fox"' in seen and GOLD in seen  # what is not declared reward-only is visible
  _assert_unseen(seen, SECRET, TESTS)


def test_a_task_declared_field_is_hidden_through_the_run_stage(tok, leaky_agent):
  leaky_agent.rows_seen.clear()
  sampler = ScriptedSampler(lookup_script(tok))
  trajs = stages.rollout(
    leaky_agent,
    [ROW],
    sampler=sampler,
    rollout_spec=RolloutSection(num_chains=2, rows_per_step=1, max_tokens_per_turn=64, max_total_tokens=512),
    end_of_turn_id=tok.token_to_id("<|im_end|>"),
    env_provider=None,
    reward_only_fields=(*REWARD_ONLY_FIELDS, "gold"),
  )
  assert [t.reward for t in trajs] == [1.0, 1.0]
  seen = json.dumps(leaky_agent.rows_seen) + "".join(tok.decode(prompt) for prompt, _ in sampler.calls)
  _assert_unseen(seen, SECRET, TESTS, GOLD)


def test_an_agent_fn_never_gets_the_reward_only_fields(tok, leaky_agent):
  rows_got = []

  async def run(client, row):  # sends its whole row to the model
    rows_got.append(dict(row))
    reply = await client.chat.completions.create(
      model="policy", messages=[{"role": "user", "content": json.dumps(row)}]
    )
    return reply.choices[0].message.content

  sampler = ScriptedSampler(lookup_script(tok))
  [t] = run_endpoint_rollout(leaky_agent, [ROW], run, sampler=sampler)
  assert t.reward == 1.0 and t.row == ROW
  assert rows_got == [{"question": ROW["question"], "key": "fox", "gold": GOLD}]
  _assert_unseen(json.dumps(rows_got) + "".join(tok.decode(p) for p, _ in sampler.calls), SECRET, TESTS)


@pytest.mark.skipif(sandbox_unavailable_reason() is not None, reason=str(sandbox_unavailable_reason()))
def test_a_harness_never_gets_the_reward_only_fields(tok, leaky_agent):
  [t] = run_endpoint_rollout(
    leaky_agent,
    [ROW],
    command_agent([sys.executable, HOSTILE, "env"]),  # answers its environment, argv and stdin
    sampler=ScriptedSampler(lookup_script(tok)),
    chain_timeout_s=60,
  )
  assert t.finish_reason == "agent_done" and t.reward == 1.0, t.error
  got = json.loads(t.prediction)
  assert json.loads(got["env"]["AGENTFLY_ROW"]) == json.loads(got["stdin"]) == agent_view(ROW, REWARD_ONLY_FIELDS)
  _assert_unseen(t.prediction, SECRET, TESTS)


def test_bad_reward_only_fields_are_named():
  assert check_reward_only("answer, hops", "x") == ("answer", "hops")
  with pytest.raises(ValueError, match="config.task.reward_only_fields: 'question' cannot be reward-only"):
    check_reward_only("answer,question", "config.task.reward_only_fields")
  with pytest.raises(ValueError, match="rollout: reward_only_fields: reward-only field names must be non-empty"):
    run_rollout(None, [ROW], sampler=None, reward_only_fields=["answer", 3])
