"""The OpenAI-compatible endpoint over a sampler: an agent written only with the `openai` SDK gets
the built-in agent's trajectories token for token; edited histories start new segments; bad
requests get OpenAI-style errors naming the field and disturb no chain; 256 chains at once keep
their own token records. (Real hypercorn server on loopback, real openai / httpx clients; the
fast scripted sampler here, the JAX sampler in test_agents_endpoint_jax.py.)"""

import json
import os

import httpx
import numpy as np
import openai
import pytest
import trio

from agentfly_jax.agents import load_tokenizer, run_rollout
from agentfly_jax.agents.endpoint import ChatEndpoint, serve_endpoint
from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
from agentfly_jax.sampling.scripted import ScriptedSampler, scripted_logprob
from agentfly_jax.tasks import lookup
from agentfly_jax.tasks.lookup_agent import LOOKUP_SCHEMA, run as openai_lookup_agent

from endpoint_testlib import WARMSTART, assert_segment_is_sampler_output, lookup_script


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(WARMSTART)


@pytest.fixture(scope="module")
def agent(tok):
  return lookup.make_agent(tok)


def test_openai_sdk_agent_gets_the_builtin_agents_trajectories(tok, agent):
  rows = lookup.make_rows(8, seed=3)
  builtin = run_rollout(agent, rows, sampler=ScriptedSampler(lookup_script(tok)), num_chains=2)
  sampler = ScriptedSampler(lookup_script(tok))
  served = run_endpoint_rollout(agent, rows, openai_lookup_agent, sampler=sampler, num_chains=2)
  assert len(served) == len(builtin) == 16
  for a, b in zip(builtin, served):
    assert b.token_ids.tolist() == a.token_ids.tolist()
    np.testing.assert_array_equal(b.action_mask, a.action_mask)
    np.testing.assert_array_equal(b.sampler_logprobs, a.sampler_logprobs)
    assert (b.group_id, b.chain_id, b.num_turns) == (a.group_id, a.chain_id, a.num_turns) == (b.group_id, b.chain_id, 2)
    assert b.reward == a.reward == 1.0 and b.finish_reason == "agent_done"
    assert [(c["name"], c["arguments"], c["ok"]) for c in b.tool_calls] == [
      (c["name"], c["arguments"], c["ok"]) for c in a.tool_calls
    ]
    assert_segment_is_sampler_output(b, sampler.calls)


async def _edited_history_agent(client, row):
  """Calls the tool, then re-asks with the tool result pasted into the user message (an edited
  history: the first turn is gone)."""
  messages = [{"role": "system", "content": lookup.SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]
  first = (
    (await client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP_SCHEMA])).choices[0].message
  )
  call = first.tool_calls[0]
  observation = await lookup.lookup.acall(**json.loads(call.function.arguments))
  messages[1] = {"role": "user", "content": f"{row['question']}\n<tool_response>\n{observation}\n</tool_response>"}
  second = await client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP_SCHEMA])
  return second.choices[0].message.content


def test_edited_history_starts_a_new_segment_masks_cover_only_completions(tok, agent):
  rows = lookup.make_rows(3, seed=5)
  sampler = ScriptedSampler(lookup_script(tok))
  trajs = run_endpoint_rollout(agent, rows, _edited_history_agent, sampler=sampler)
  assert [(t.group_id, t.segment) for t in trajs] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
  for t in trajs:
    assert t.num_turns == 1 and t.reward == 1.0  # the answer of segment 1 is right
    assert_segment_is_sampler_output(t, sampler.calls)
    # the segment is a fresh rendering of that request + exactly the sampled completion
    assert t.token_ids[: t.prompt_length].tolist() == tok.encode(
      agent.render(t.messages[:-1], None, add_generation_prompt=True)
    )
    assert not t.action_mask[: t.prompt_length].any() and t.action_mask[t.prompt_length :].all()


def _first_fed_routes(traj, calls) -> np.ndarray:
  """The routes each token of `traj` got from the first of its requests that fed it to the model (its requests:
  the sampler calls whose prompt and reply lie along its tokens, in call order)."""
  ids, routes = traj.token_ids.tolist(), None
  for prompt, result in calls:
    n = len(prompt) + len(result.token_ids)
    if ids[:n] == prompt + result.token_ids:
      r = result.routed_experts
      routes = r if routes is None else np.concatenate([routes, r[len(routes) :]])
  return routes


@pytest.mark.parametrize("agent_fn", ["openai", "edited", "two_choices"])
def test_a_moe_samplers_routes_follow_each_segments_tokens(tok, agent, agent_fn):
  """Router replay for endpoint agents: every segment's trajectory carries the routes of its fed tokens, each
  token those of the request that first fed it (a continued segment keeps its prefix's, a fork copies them)."""
  fn = {"openai": openai_lookup_agent, "edited": _edited_history_agent, "two_choices": _two_choice_agent}[agent_fn]
  sampler = ScriptedSampler(lookup_script(tok), routes=(3, 2))
  trajs = run_endpoint_rollout(agent, lookup.make_rows(3, seed=7), fn, sampler=sampler, num_chains=2, max_n=2)
  assert trajs and len(sampler.calls) > len(trajs) // 2
  for t in trajs:
    assert t.routed_experts.shape == (len(t.token_ids) - 1, 3, 2), (t.group_id, t.chain_id, t.segment)
    np.testing.assert_array_equal(t.routed_experts, _first_fed_routes(t, sampler.calls))
  for (prompt, _), given in zip(sampler.calls, sampler.prompt_routes_seen):  # a request brings its prefix's
    if given is not None:
      assert len(given) < len(prompt)
      owner = next(t for t in trajs if t.token_ids.tolist()[: len(prompt)] == prompt)
      np.testing.assert_array_equal(given, owner.routed_experts[: len(given)])
  assert any(g is not None for g in sampler.prompt_routes_seen) == (agent_fn != "edited")
  builtin_sampler = ScriptedSampler(lookup_script(tok), routes=(3, 2))  # the built-in agent's chains alike
  builtin = run_rollout(agent, lookup.make_rows(2, seed=7), sampler=builtin_sampler, num_chains=2)
  for t in builtin:
    np.testing.assert_array_equal(t.routed_experts, _first_fed_routes(t, builtin_sampler.calls))
  later = [g for g in builtin_sampler.prompt_routes_seen if g is not None]
  assert len(later) == len(builtin)  # every chain's second turn replays its first's routes
  if agent_fn == "openai":  # two requests a chain: the second's routes differ for the first's tokens (kept)
    t = trajs[0]
    first = next(r for p, r in sampler.calls if t.token_ids.tolist()[: len(p)] == p)
    later = [r for p, r in sampler.calls if t.token_ids.tolist()[: len(p)] == p][-1]
    n = len(first.routed_experts)
    assert (later.routed_experts[:n] != first.routed_experts).any()


async def _two_choice_agent(client, row):
  messages = [{"role": "user", "content": row["question"]}]
  reply = await client.chat.completions.create(model="policy", messages=messages, n=2, tools=[LOOKUP_SCHEMA])
  assert len(reply.choices) == 2
  second = reply.choices[1].message  # continue the second choice: the first stays a segment
  messages += [
    second.model_dump(exclude_none=True),
    {
      "role": "tool",
      "tool_call_id": second.tool_calls[0].id,
      "content": await lookup.lookup.acall(**json.loads(second.tool_calls[0].function.arguments)),
    },
  ]
  return (
    (await client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP_SCHEMA]))
    .choices[0]
    .message.content
  )


def test_n_choices_fork_segments(tok, agent):
  sampler = ScriptedSampler(lookup_script(tok))
  trajs = run_endpoint_rollout(agent, lookup.make_rows(1, seed=1), _two_choice_agent, sampler=sampler, max_n=2)
  assert [(t.segment, t.num_turns) for t in trajs] == [(0, 1), (1, 2)]
  assert trajs[0].prompt_length == trajs[1].prompt_length
  assert trajs[0].token_ids[: trajs[0].prompt_length].tolist() == trajs[1].token_ids[: trajs[1].prompt_length].tolist()
  for t in trajs:
    assert_segment_is_sampler_output(t, sampler.calls)
  assert trajs[1].reward == 1.0


# --------------------------------------------------------------------------- bad requests
def _good_body(question="Find the code of key \"fox\"."):
  return {"model": "policy", "messages": [{"role": "user", "content": question}], "tools": [LOOKUP_SCHEMA]}


BAD_REQUESTS = [
  ("malformed JSON", b'{"model": "policy", "messages": [', 400, "not valid JSON"),
  ("unknown model", dict(_good_body(), model="gpt-9"), 404, "model: 'gpt-9' does not exist"),
  (
    "unrenderable messages",
    dict(_good_body(), messages=[{"role": "wizard", "content": "x"}]),
    400,
    "messages: the chat template cannot render them: TemplateError: Unknown message role: wizard",
  ),
  ("no role", dict(_good_body(), messages=[{"content": "x"}]), 400, "messages[0].role must be"),
  (
    "image content",
    dict(_good_body(), messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    400,
    "messages[0].content[0]",
  ),
  ("n over the limit", dict(_good_body(), n=3), 400, "n=3 is over this run's limit"),
  ("bad max_tokens", dict(_good_body(), max_tokens=0), 400, "max_tokens must be an integer >= 1"),
  ("bad temperature", dict(_good_body(), temperature="hot"), 400, "temperature must be"),
  ("bad tools", dict(_good_body(), tools=[{"type": "function"}]), 400, "tools[0]"),
  ("bad tool_choice", dict(_good_body(), tool_choice="always"), 400, "tool_choice must be"),
]


@pytest.mark.trio
async def test_bad_requests_get_openai_errors_naming_the_field_and_disturb_no_chain(tok, agent):
  sampler = ScriptedSampler(lookup_script(tok), delay_s=0.01)
  endpoint = ChatEndpoint(agent, sampler, max_tokens_per_turn=64, max_total_tokens=512, max_n=2, max_turns=3)
  good = endpoint.open_chain(0, 0)
  bad = endpoint.open_chain(1, 0)
  async with serve_endpoint(endpoint) as base_url:
    async with httpx.AsyncClient(base_url=base_url, trust_env=False) as http:
      client = openai.AsyncOpenAI(base_url=base_url, api_key=good, max_retries=0, http_client=http)
      first = await client.chat.completions.create(**_good_body())
      good_ids = list(endpoint.chains[good].segments[0].ids)
      async with trio.open_nursery() as nursery:  # the good chain goes on while the bad one errs
        results = {}

        async def good_turn():
          results["good"] = await client.chat.completions.create(**_good_body('Find the code of key "owl".'))

        nursery.start_soon(good_turn)
        for label, body, status, message in BAD_REQUESTS:
          content = body if isinstance(body, bytes) else json.dumps(body).encode()
          r = await http.post(
            "/chat/completions",
            content=content,
            headers={"Authorization": f"Bearer {bad}", "Content-Type": "application/json"},
          )
          assert r.status_code == status, (label, r.text)
          error = r.json()["error"]
          assert message in error["message"], (label, error)
          assert set(error) == {"message", "type", "param", "code"}
      # the SDK raises the matching exception classes
      with pytest.raises(openai.AuthenticationError, match="unknown chain key"):
        await openai.AsyncOpenAI(
          base_url=base_url, api_key="sk-nope", max_retries=0, http_client=http
        ).chat.completions.create(**_good_body())
      with pytest.raises(openai.NotFoundError, match="model"):
        await client.chat.completions.create(**dict(_good_body(), model="gpt-9"))
      with pytest.raises(openai.BadRequestError, match="context"):
        await client.chat.completions.create(**_good_body("fox " * 600))
      third = await client.chat.completions.create(**_good_body())
      with pytest.raises(openai.BadRequestError, match="max_turns=3"):
        await client.chat.completions.create(**_good_body())
      models = await client.models.list()
      assert [m.id for m in models.data] == ["policy"]
  assert endpoint.chains[bad].segments == [] and endpoint.chains[bad].num_requests == 0
  record = endpoint.chains[good]
  assert record.num_requests == 3 and len(record.segments) == 3  # three fresh conversations
  assert record.segments[0].ids == good_ids
  for reply in (first, results["good"], third):
    assert reply.choices[0].finish_reason == "tool_calls"
  for seg in record.segments:
    assert_segment_is_sampler_output(_as_traj(seg), sampler.calls)


def _as_traj(seg):
  from agentfly_jax.agents import Trajectory

  return Trajectory(token_ids=seg.ids, action_mask=seg.mask, sampler_logprobs=seg.logps)


# --------------------------------------------------------------------------- 256 chains
def test_256_chains_at_once_every_request_answered_no_record_mixed_up(tok, agent):
  rows = [
    {"question": f'Find the code of key "{k}". {tag}', "key": k, "answer": lookup.secret_code(k)}
    for tag in lookup.WORDS[:4]
    for k in lookup.KEYS[:64]
  ]  # 256 different prompts, 1 chain each
  sampler = ScriptedSampler(lookup_script(tok), delay_s=0.05)  # concurrent turns overlap
  trajs = run_endpoint_rollout(agent, rows, openai_lookup_agent, sampler=sampler, num_chains=1, concurrency=256)
  assert len(trajs) == 256 and len(sampler.calls) == 512
  for t in trajs:
    assert t.error is None and t.finish_reason == "agent_done" and t.reward == 1.0, t
    text = tok.decode(t.token_ids)
    key = t.row["key"]
    assert t.row["question"] in text and text.count(f'"{key}"') == 2  # its own row's question
    assert f"The code is {t.row['answer']}." in text
    assert_segment_is_sampler_output(t, sampler.calls)
    assert scripted_logprob(t.prompt_length, 0, int(t.token_ids[t.prompt_length])) == pytest.approx(
      float(t.sampler_logprobs[t.prompt_length])
    )


# --------------------------------------------------------------------------- gathering a turn
class _ArrivalSampler(ScriptedSampler):
  """Records when each request reached the sampler (trio clock)."""

  def __init__(self, script):
    super().__init__(script, delay_s=0.01)
    self.arrivals = []

  async def agenerate(self, prompt, params):
    self.arrivals.append(trio.current_time())
    return await super().agenerate(prompt, params)


@pytest.mark.parametrize("gather_s", [0.0, 0.5])
def test_gather_lets_a_turns_requests_reach_the_sampler_together(tok, agent, gather_s):
  sent = []

  async def late_agent(client, row):  # agents that send their first request 0..450 ms apart
    await trio.sleep(0.03 * lookup.KEYS.index(row["key"]))
    sent.append(trio.current_time())
    return await openai_lookup_agent(client, row)

  rows = [
    {"question": f'Find the code of key "{k}".', "key": k, "answer": lookup.secret_code(k)} for k in lookup.KEYS[:16]
  ]
  sampler = _ArrivalSampler(lookup_script(tok))
  trajs = run_endpoint_rollout(agent, rows, late_agent, sampler=sampler, gather_s=gather_s)
  assert all(t.reward == 1.0 for t in trajs)
  first_turn = sorted(sampler.arrivals)[:16]
  if gather_s:  # held until all 16 were in: one batch for a batching sampler
    assert first_turn[0] >= max(sent)
  else:  # each went on alone
    assert first_turn[0] < max(sent)


# --------------------------------------------------------------------------- config.task.agent
async def _one_argument(row):
  return "x"


@pytest.mark.parametrize(
  "spec, message",
  [
    ("agentfly_jax.tasks.lookup_agent:run", None),
    ("test_agents_endpoint:_one_argument", "'_one_argument' must take \\(client, row\\)"),
    ("agentfly_jax.tasks.lookup_agent:LOOKUP_SCHEMA", "must be a function \\[async\\] def run\\(client, row\\)"),
    ("agentfly_jax.tasks.lookup_agent:nope", "has no attribute 'nope'"),
    ("no_such_module_xyz:run", "does not import"),
  ],
)
def test_config_task_agent_is_checked_before_anything_is_built(spec, message):
  from agentfly_jax.rl.config import default_config
  from agentfly_jax.tasks.from_config import build_task, set_custom_task

  config = set_custom_task(default_config(), module="agentfly_jax.tasks.lookup", agent=spec)
  if message is None:
    assert build_task(config).agent_fn is openai_lookup_agent
    return
  with pytest.raises(ValueError, match=f"config.task.agent='{spec}'.*{message}"):
    build_task(config)


def test_task_agent_fn_must_take_client_and_row():
  from agentfly_jax.tasks import Task

  with pytest.raises(ValueError, match="Task.agent_fn '_one_argument' must take \\(client, row\\)"):
    Task(reward=lookup.code_match, rows=lookup.make_rows(2, 0), agent_fn=_one_argument)
  with pytest.raises(ValueError, match="Task.reward is missing"):
    Task(rows=lookup.make_rows(2, 0), agent_fn=openai_lookup_agent)


# --------------------------------------------------------------------------- how chains end
async def _endless_agent(client, row):  # never stops asking: refused at max_turns, then raises
  messages = [{"role": "user", "content": row["question"]}]
  while True:
    reply = await client.chat.completions.create(model="policy", messages=messages)
    messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]


async def _crashing_agent(client, row):
  await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["question"]}])
  raise RuntimeError("the agent's own bug")


async def _sleepy_agent(client, row):
  await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["question"]}])
  await trio.sleep(30)


@pytest.mark.parametrize(
  "agent_fn, finish, error, turns",
  [
    (_endless_agent, "max_turns", None, 3),
    (_crashing_agent, "error", "RuntimeError: the agent's own bug", 1),
    (_sleepy_agent, "timeout", None, 1),
  ],
)
def test_chain_endings_keep_the_tokens_and_name_the_reason(tok, agent, agent_fn, finish, error, turns):
  eot = tok.token_to_id("<|im_end|>")
  sampler = ScriptedSampler(lambda prompt: tok.encode(lookup.answer_text("amber")) + [eot])
  rows = [{"question": 'Find the code of key "fox".', "key": "fox", "answer": "amber"}]
  [t] = run_endpoint_rollout(agent, rows, agent_fn, sampler=sampler, max_turns=3, chain_timeout_s=1.0)
  assert (t.finish_reason, t.error, t.num_turns) == (finish, error, turns)
  assert t.reward == (0.0 if error else 1.0)  # scored on the last completion unless it crashed
  assert_segment_is_sampler_output(t, sampler.calls)
