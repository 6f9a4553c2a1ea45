"""The asyncio agents' HTTP client over aiohttp (httpx-aiohttp's transport, agents/agent_loops.py): an
asyncio chain's `openai.AsyncOpenAI` sends through `AiohttpTransport` (httpx's own transport when switched
off), the endpoint's error replies reach the agent as the SDK's errors with their status and code, and a
refused connection is the SDK's connection error. (Real hypercorn endpoint on loopback; scripted sampler.)"""

import asyncio

import httpx
import openai
import pytest

from agentfly_jax.agents import agent_loops, load_tokenizer
from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import lookup
from agentfly_jax.tasks.lookup import SYSTEM_PROMPT

from endpoint_testlib import WARMSTART, lookup_script


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(WARMSTART)


@pytest.fixture(scope="module")
def agent(tok):
  return lookup.make_agent(tok)


async def _transport_and_errors(client, row):
  """Its client's transport, then what a request for an unknown model and a good one give back."""
  messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]
  seen = [type(client._client._transport).__name__]
  try:
    await client.chat.completions.create(model="no-such-model", messages=messages)
  except openai.NotFoundError as e:
    seen.append(f"{e.status_code} {e.code}")
  reply = await client.chat.completions.create(model="policy", messages=messages)
  seen.append(reply.choices[0].finish_reason)
  return " | ".join(seen)


@pytest.mark.parametrize("use_aiohttp, transport", [(True, "AiohttpTransport"), (False, "AsyncHTTPTransport")])
def test_asyncio_chains_send_through_aiohttp_and_get_the_endpoints_errors(
  tok, agent, monkeypatch, use_aiohttp, transport
):
  monkeypatch.setattr(agent_loops, "USE_AIOHTTP", use_aiohttp)
  trajs = run_endpoint_rollout(
    agent, lookup.make_rows(2, 0), _transport_and_errors, sampler=ScriptedSampler(lookup_script(tok)), num_chains=2
  )
  assert [t.finish_reason for t in trajs] == ["agent_done"] * 4
  assert {t.prediction for t in trajs} == {f"{transport} | 404 model_not_found | tool_calls"}


def test_a_refused_connection_is_the_sdks_connection_error():
  async def ask():
    http = agent_loops._http_client(None, over_aiohttp=True)
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", http_client=http, max_retries=0)
    try:
      await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    finally:
      await http.aclose()

  with pytest.raises(openai.APIConnectionError) as caught:
    asyncio.run(ask())
  assert isinstance(caught.value.__cause__, httpx.ConnectError)
