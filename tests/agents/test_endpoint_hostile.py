"""Hostile requests to the OpenAI-compatible endpoint (real hypercorn server on loopback, real httpx client):
a body over the cap is a 413 read no further than the cap, and neither it nor a heavy body under the cap
stalls another chain's request; JSON nested 10,000 deep, a malformed tool_choice, tool_call_id or
tool_calls are 400s naming the field and are no turn of the chain; `usage` is what the sampler was sent
and returned; a chain key is never logged in full."""

import json
import logging
import threading
import time

import httpx
import pytest
import trio

from agentfly_jax.agents import load_tokenizer
from agentfly_jax.agents.endpoint import ChatEndpoint, key_label, serve_endpoint
from agentfly_jax.agents.tokenizer import GIL_FREE_CHARS
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import lookup
from agentfly_jax.tasks.lookup_agent import LOOKUP_SCHEMA

from endpoint_testlib import WARMSTART, lookup_script


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(WARMSTART)


@pytest.fixture(scope="module")
def agent(tok):
  return lookup.make_agent(tok)


def _messages(question='Find the code of key "fox".'):
  return [{"role": "system", "content": lookup.SYSTEM_PROMPT}, {"role": "user", "content": question}]


def _body(messages=None, **extra):
  return {"model": "policy", "messages": messages or _messages(), "tools": [LOOKUP_SCHEMA], **extra}


async def _post(http, key, body):
  content = body if isinstance(body, (bytes, bytearray)) or hasattr(body, "__aiter__") else json.dumps(body).encode()
  return await http.post("/chat/completions", content=content, headers={"Authorization": f"Bearer {key}"})


def _endpoint(tok, agent, **kwargs):
  sampler = ScriptedSampler(lookup_script(tok))
  return ChatEndpoint(agent, sampler, max_tokens_per_turn=64, max_total_tokens=512, **kwargs)  # the default cap


def _good_chain_latencies(base_url, key, stop: threading.Event, out: list) -> None:
  """A good chain's fresh requests, back to back until `stop`, from a thread of its own (its clock runs while
  the server's event loop is held): each one's wall time."""
  with httpx.Client(base_url=base_url, trust_env=False, timeout=120) as http:
    while not stop.is_set():
      start = time.monotonic()
      r = http.post("/chat/completions", json=_body(), headers={"Authorization": f"Bearer {key}"})
      assert r.status_code == 200, r.text
      out.append(time.monotonic() - start)


@pytest.mark.trio
async def test_oversize_and_heavy_bodies_never_stall_another_chain(tok, agent):
  endpoint = _endpoint(tok, agent)
  good, bad = endpoint.open_chain(0, 0), endpoint.open_chain(1, 0)
  eight_mb = json.dumps(_body(_messages("x" * (8 << 20)))).encode()

  async def chunked():  # no Content-Length: the server must count as it reads
    for i in range(0, len(eight_mb), 1 << 16):
      yield eight_mb[i : i + (1 << 16)]

  # under the cap but heavy: 1.1 MB of messages to parse, render and tokenize, then over the context (400); on the
  # event loop this held every other request ~2 s
  heavy = _body([*_messages(), *[{"role": "user", "content": "fox owl " * 200}] * 700])
  async with serve_endpoint(endpoint) as base_url:
    async with httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=120) as http:
      await _post(http, good, _body())  # warm
      latencies, refusals, stop = [], [], threading.Event()
      async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, _good_chain_latencies, base_url, good, stop, latencies)
        while len(latencies) < 3:
          await trio.sleep(0.01)
        for body in (eight_mb, chunked(), heavy):
          start = time.monotonic()
          r = await _post(http, bad, body)
          refusals.append((r.status_code, r.json()["error"]["code"], time.monotonic() - start))
        stop.set()
  assert [(status, code) for status, code, _ in refusals] == [
    (413, "request_too_large"),
    (413, "request_too_large"),
    (400, "context_length_exceeded"),
  ]
  # the heavy one was heavy (~1-2 s of work, by the machine) and the good chain's requests were served meanwhile,
  # each in a fraction of that time (on the event loop every one would have waited for all of it)
  assert refusals[-1][2] > 2 * max(latencies), (max(latencies), refusals)
  assert max(latencies) < 1.0, (max(latencies), refusals)
  assert endpoint.chains[bad].num_requests == 0 and endpoint.chains[bad].segments == []


def test_a_long_text_is_tokenized_as_a_short_one_is(tok):
  text = 'fox <|im_end|> owl é "code" ' * 4000
  assert len(text) > GIL_FREE_CHARS  # tokenized by encode_batch
  assert tok.encode(text) == list(tok._backend.encode(text, add_special_tokens=False).ids)


def _nested(depth: int):
  return json.loads("[" * depth + "]" * depth) if depth < 500 else None


BAD = [
  ("10,000 deep", b'{"model": "policy", "messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", "json_too_deep", None),
  (
    "100 deep tool schema",
    dict(_body(), tools=[{"type": "function", "function": {"name": "f", "parameters": {"a": _nested(100)}}}]),
    "json_too_deep",
    "body.tools[0].function.parameters.a",
  ),
  (
    "tool_choice.function a string",
    _body(tool_choice={"type": "function", "function": "lookup"}),
    None,
    "tool_choice.function",
  ),
  ("tool_choice a number", _body(tool_choice=3), None, "tool_choice"),
  (
    "tool_call_id an object",
    _body([*_messages(), {"role": "tool", "tool_call_id": {"id": 1}, "content": "x"}]),
    None,
    "messages[2].tool_call_id",
  ),
  (
    "tool_calls arguments a number",
    _body(
      [*_messages(), {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 7}}]}]
    ),
    None,
    "messages[2].tool_calls[0].function.arguments",
  ),
  (
    "tool_calls id an object",
    _body([*_messages(), {"role": "assistant", "tool_calls": [{"id": [1], "function": {"name": "f"}}]}]),
    None,
    "messages[2].tool_calls[0].id",
  ),
  ("tool_calls not a list", _body([*_messages(), {"role": "assistant", "tool_calls": "f()"}]), None, "messages[2]"),
  (
    "parameters not an object",
    dict(_body(), tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
    None,
    "tools[0].function.parameters",
  ),
]


@pytest.mark.trio
async def test_malformed_fields_are_400s_naming_them_and_no_turn(tok, agent):
  endpoint = _endpoint(tok, agent, max_turns=2)
  key = endpoint.open_chain(0, 0)
  async with serve_endpoint(endpoint) as base_url:
    async with httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=60) as http:
      first = (await _post(http, key, _body())).json()
      reply = first["choices"][0]["message"]
      assert reply["tool_calls"], reply
      for label, body, code, param in BAD:
        r = await _post(http, key, body)
        assert r.status_code == 400, (label, r.text)
        error = r.json()["error"]
        if code is not None:
          assert error["code"] == code, (label, error)
        if param is not None:
          assert error["param"].startswith(param) and param in error["message"], (label, error)
      # the chain's second turn still goes through (no refused request counted toward max_turns=2)
      call = reply["tool_calls"][0]
      result = {"role": "tool", "tool_call_id": call["id"], "content": "The code is amber."}
      second = await _post(http, key, _body([*_messages(), reply, result]))
      assert second.status_code == 200, second.text
  record = endpoint.chains[key]
  assert record.num_requests == 2 and len(record.segments) == 1 and record.segments[0].num_turns == 2
  assert [c["observation"] for c in record.tool_calls.values()] == ["The code is amber."]
  # usage is what the sampler was sent and what it returned, on the continued turn too
  for reply_json, (prompt, result) in zip([first, second.json()], endpoint.sampler.calls[-2:]):
    assert reply_json["usage"]["prompt_tokens"] == len(prompt)
    assert reply_json["usage"]["completion_tokens"] == len(result.token_ids)
  assert len(endpoint.sampler.calls[-1][0]) == len(record.segments[0].ids) - len(
    endpoint.sampler.calls[-1][1].token_ids
  )


class _Broken(ScriptedSampler):
  async def agenerate(self, prompt, params):
    raise RuntimeError("sampler down")


@pytest.mark.trio
async def test_a_chain_key_is_never_logged_in_full(tok, agent, caplog):
  endpoint = ChatEndpoint(agent, _Broken([[1]]), max_tokens_per_turn=64, max_total_tokens=512)
  key = endpoint.open_chain(3, 1)
  with caplog.at_level(logging.DEBUG):
    async with serve_endpoint(endpoint) as base_url:
      async with httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=60) as http:
        r = await _post(http, key, _body())
  assert r.status_code == 500 and "sampler down" in r.json()["error"]["message"]
  logged = "\n".join(rec.getMessage() + (rec.exc_text or "") for rec in caplog.records)
  assert key_label(key) in logged and key not in logged and key[12:] not in logged
  assert key not in r.text
