"""An OpenAI-compatible chat-completions endpoint over any Sampler, with exact token records.

  endpoint = ChatEndpoint(agent, sampler, max_tokens_per_turn=256, max_total_tokens=2048)
  key = endpoint.open_chain(group_id=0, chain_id=0, row=row)     # one API key per chain
  async with serve_endpoint(endpoint) as base_url:                # hypercorn, trio, loopback
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key)
    reply = await client.chat.completions.create(model="policy", messages=[...], tools=[...])
  trajectories = endpoint.close_chain(key).trajectories(reward=..., ...)

`POST /v1/chat/completions` takes messages, tools, tool_choice, temperature, max_tokens (or
max_completion_tokens), n (other fields are ignored; `stream` is refused). The messages are
rendered with the agent's chat template (`agent.render`; tools go through
`agent.template_tools`, so an agent that describes tools its own way keeps doing so), the prompt
ids go to `sampler.agenerate`, and the reply's `tool_calls` come from the agent's parser
(`agent.parse`: Hermes `<tool_call>` JSON for a ToolCallAgent); `tool_choice="none"` returns the
text unparsed, "required" or a named function are accepted but not enforced (no constrained
decoding: the model's own turn is what is trained on). Per chain (the request's API
key) the endpoint records the exact prompt and completion ids and the sampler's log-probs
(`endpoint_records.ChainRecord`); the trajectory is built from those ids, never by
re-tokenising the text the agent saw. `GET /v1/models` lists the one model. A message's content may
hold image parts (`{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`; remote URLs are
never fetched) when the agent reads images (`agent.vision`, a vision-language policy): they are expanded to
the image's tokens by its processor, sent to the sampler as the prompt's images, and kept in the trajectory;
an image for a text-only agent, or one that does not decode, is a 400 naming the part.

Bad requests get OpenAI-style errors (`{"error": {"message", "type", "param", "code"}}`, the
message naming the field) and leave every chain's record as it was (a refused request is no turn):
an unknown chain key (401, before the body is read), a body over `max_body_bytes` (413, read chunk by
chunk and refused as soon as it is over), malformed JSON or JSON nested too deep (400), any field of
the wrong type or shape (400 naming it: agents/endpoint_request.py), an unknown model (404), a message
list the template cannot render (400), `n` over the run's limit (400), a prompt over the context (400),
more requests than `max_turns` (400). A body over `OFFLOAD_BYTES` is parsed, rendered and tokenized in a
worker thread, so one heavy request never holds the event loop the other chains' requests share. Chain
keys are logged as `key_label(key)` (a prefix and a hash), never in full. `usage` counts the prompt ids
the sampler was sent and the ids it returned. `max_tokens` / `max_completion_tokens` above the run's
per-turn limit is clamped to it (the choice's `finish_reason` is "length" where the completion was cut;
`ChainRecord.clamped_requests` counts them, the step metric `rollout/clamped_max_tokens`), so an agent's
own setting never breaks it. A chain whose harness runs sandboxed is bound to its sandbox's address
(`bind_chain`): its key sent from anywhere else is a 401.

Served under trio by hypercorn's trio worker (`serve_endpoint`): the app runs in the same trio
loop as the rollout, so a request awaits `sampler.agenerate` directly and concurrent chains are
batched by the sampler like the built-in agents' turns (no thread hop, no second event loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import secrets
import time
import uuid
from typing import Any

import trio

from agentfly_jax.agents.endpoint_records import ChainRecord, RequestPrompt, message_key, template_message
from agentfly_jax.agents.endpoint_request import ChatRequest, EndpointError, parse_request, read_body
from agentfly_jax.agents.rollout import (
  _request_seed,
  check_shared_turns,
  shared_chain_id,
)
from agentfly_jax.agents.standalone_limits import STANDALONE
from agentfly_jax.sampling.protocol import SamplingParams, agenerate_with_images
from agentfly_jax.vision.decode import ImageError

log = logging.getLogger(__name__)
# Bodies over this many bytes are parsed, rendered and tokenized in a worker thread (smaller ones inline: the
# hop would cost more than the work); either way the event loop the other chains share is never held long.
OFFLOAD_BYTES = 64 << 10


def key_label(key: str | None) -> str:
  """How a chain key is logged: never in full (its first 12 characters, "sk-chain-" and at least 3 of the
  ids, so none of its random part, and 8 hex digits of its sha256)."""
  if not key:
    return "<no key>"
  return f"{key[:12]}…{hashlib.sha256(key.encode()).hexdigest()[:8]}"


class _SchemaTool:
  """A request's tool schema, shaped like a `Tool` for `agent.template_tools`."""

  def __init__(self, schema: dict):
    self.schema = schema
    self.name = schema["function"]["name"]
    self.description = schema["function"].get("description", "")
    self.parameters = schema["function"].get("parameters") or {"type": "object", "properties": {}}


class ChatEndpoint:
  """The endpoint's state: the agent (template, parser, stop ids), the sampler, the run's limits
  and one `ChainRecord` per open chain key.

  Args:
    agent: an `Agent` (its tokenizer, chat template, tool-call parser and end-of-turn ids).
    sampler: anything with `async agenerate(prompt_ids, params) -> SampleResult`.
    model_name: the one model id served.
    sampling_params: temperature / top-p / top-k defaults (and extra stop ids).
    max_tokens_per_turn: most tokens one completion may generate (`max_tokens` above: clamped).
    max_total_tokens: most tokens of a segment's context (prompt + completion).
    max_turns: most requests per chain (None: no limit).
    max_n: most choices per request.
    seed: base seed; request k of chain (g, c) gets the seed the built-in rollout gives turn k.
    shared_turns: a group's chains send their first `shared_turns` requests with the same seeds
      (as the built-in rollout's `shared_turns`; a deterministic agent then shares its opening).
    fixed_temperature: use `sampling_params.temperature` whatever the request asks (training:
      the loss assumes the run's temperature); False honours the request's `temperature`.
    gather_s: hold requests while other open chains may still send theirs, so that a turn's
      requests, which reach the endpoint spread out by the agents' and the HTTP stack's own
      work, reach the sampler together and are batched as one: a group is let through as soon
      as every open chain is held or sampling, or when no request came for `gather_s`, or
      10 x `gather_s` after its first request. 0 = no holding.
    max_body_bytes: the largest request body read (413 beyond it, refused before it is read whole).
  """

  def __init__(
    self,
    agent,
    sampler,
    *,
    model_name: str = "policy",
    sampling_params: SamplingParams | None = None,
    max_tokens_per_turn: int = STANDALONE.max_tokens_per_turn,
    max_total_tokens: int = STANDALONE.max_total_tokens,
    max_turns: int | None = None,
    max_n: int = 1,
    seed: int | None = 0,
    fixed_temperature: bool = False,
    gather_s: float = 0.0,
    shared_turns: int = 0,
    max_body_bytes: int = STANDALONE.endpoint_max_body_bytes,
  ):
    check_shared_turns("ChatEndpoint", shared_turns, seed)
    for name, value in [
      ("max_tokens_per_turn", max_tokens_per_turn),
      ("max_total_tokens", max_total_tokens),
      ("max_n", max_n),
      ("max_body_bytes", max_body_bytes),
    ]:
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"ChatEndpoint: {name} must be an int >= 1, got {value!r}")
    self.agent, self.sampler, self.model_name = agent, sampler, model_name
    self.sampling_params = sampling_params or SamplingParams()
    self.max_tokens_per_turn, self.max_total_tokens = max_tokens_per_turn, max_total_tokens
    self.max_turns, self.max_n, self.seed, self.shared_turns = max_turns, max_n, seed, shared_turns
    self.fixed_temperature = fixed_temperature
    self.stop_ids = tuple(dict.fromkeys([*self.sampling_params.stop_token_ids, *agent.stop_token_ids]))
    self.chains: dict[str, ChainRecord] = {}
    self.max_body_bytes = max_body_bytes
    # per chain: held while a request's prompt is built (maybe in a worker thread) and while replies are
    # recorded, so a thread never reads a segment the trio thread is extending
    self._locks: dict[str, trio.Lock] = {}
    self.created = int(time.time())
    self.gather_s = float(gather_s)
    self._gate: trio.Event | None = None  # the group of held requests (see `_gather`)
    self._gate_first = self._gate_deadline = 0.0
    self._held = 0  # requests held at the gate
    self._sampling = 0  # requests inside sampler.agenerate
    self._app = None

  # -- chains ----------------------------------------------------------------------------------
  def open_chain(self, group_id: int = 0, chain_id: int = 0, row: dict | None = None) -> str:
    """A new chain's API key (its requests are recorded under it)."""
    key = f"sk-chain-{group_id}-{chain_id}-{secrets.token_hex(8)}"
    self.chains[key] = ChainRecord(key, group_id, chain_id, row)
    self._locks[key] = trio.Lock()
    return key

  def bind_chain(self, key: str, host: str) -> None:
    """From now on the chain's key is taken only from the client address `host` (its harness's sandbox
    reaches the endpoint from an address of its own: agents/harness_sandbox.py); from anywhere else: 401."""
    self.chains[key].client_host = host

  def close_chain(self, key: str) -> ChainRecord:
    """Forgets the key (later requests with it get 401) and returns its record."""
    record = self.chains.pop(key)
    self._locks.pop(key, None)
    self._maybe_open_gate()  # one chain fewer to wait for
    return record

  # -- gathering a turn's requests ---------------------------------------------------------------
  def _maybe_open_gate(self) -> None:
    if self._gate is not None and self._held + self._sampling >= len(self.chains):
      self._open_gate()

  def _open_gate(self) -> None:
    if self._gate is not None:
      self._gate.set()
      self._gate, self._held = None, 0

  async def _gather(self) -> None:
    """Holds this request until every open chain is held or sampling, or no request came for
    `gather_s`, or 10 x `gather_s` after the group's first request."""
    if self.gather_s <= 0:
      return
    now = trio.current_time()
    if self._gate is None:
      self._gate, self._gate_first = trio.Event(), now
    gate = self._gate
    self._held += 1
    self._gate_deadline = min(now + self.gather_s, self._gate_first + 10 * self.gather_s)
    self._maybe_open_gate()
    while self._gate is gate:
      with trio.move_on_at(self._gate_deadline):
        await gate.wait()
      if self._gate is gate and trio.current_time() >= self._gate_deadline:
        self._open_gate()  # no request for gather_s (or held 10 x gather_s): let the group go

  # -- one request -------------------------------------------------------------------------------
  def _params(self, request: ChatRequest, budget: int, seed: int | None) -> SamplingParams:
    temperature = self.sampling_params.temperature
    if request.temperature is not None and not self.fixed_temperature:
      temperature = float(request.temperature)
    return dataclasses.replace(
      self.sampling_params, temperature=temperature, max_new_tokens=budget, stop_token_ids=self.stop_ids, seed=seed
    )

  def chain_of(self, key: str | None, client_host: str | None = None) -> ChainRecord:
    """The open chain of an API key sent from `client_host` (None: not known, a direct call); 401 for an
    unknown key, or for a bound chain's key (`bind_chain`) sent from another address."""
    chain = self.chains.get(key) if key else None
    if chain is None:
      why = "unknown chain key (send the chain's key as 'Authorization: Bearer <key>')"
    elif chain.client_host is not None and client_host is not None and client_host != chain.client_host:
      log.warning("endpoint: the key of chain %s was sent from outside its sandbox (%s)", key_label(key), client_host)
      why, chain = "this chain's key is bound to its own sandbox and was sent from elsewhere", None
    if chain is None:
      raise EndpointError(401, f"api_key: {why}", "api_key", "invalid_api_key", "authentication_error")
    return chain

  def _request_prompt(self, chain: ChainRecord, request: ChatRequest) -> RequestPrompt:
    """The request's prompt ids (rendered and tokenized: `ChainRecord.request_prompt`); 400 when the template fails."""
    schema_tools = [_SchemaTool(t) for t in request.tools or ()]
    template_tools = self.agent.template_tools(schema_tools) if schema_tools else None
    tools_key = json.dumps(request.tools, sort_keys=True, default=str)
    try:
      return chain.request_prompt(self.agent, request.messages, tools_key, template_tools)
    except ImageError as e:  # an image part that does not decode, too large, or for a model that reads none
      raise EndpointError(400, f"messages: {e}", "messages", "invalid_image") from None
    except Exception as e:  # jinja errors, a template that is not prefix-stable, ...
      raise EndpointError(
        400, f"messages: the chat template cannot render them: {type(e).__name__}: {e}", "messages", "template_error"
      ) from None

  async def complete(self, key: str | None, body: Any) -> dict:
    """One chat completion for chain `key` (the OpenAI reply as a dict); `body`: the request's bytes or its
    parsed JSON. Raises EndpointError; a refused request changes nothing of the chain (no turn counted)."""
    chain = self.chain_of(key)
    heavy = len(body) > OFFLOAD_BYTES if isinstance(body, (bytes, bytearray)) else False

    async def off_loop(fn, *args):  # a heavy request's CPU work in a worker thread
      return await trio.to_thread.run_sync(fn, *args) if heavy else fn(*args)

    parse = functools.partial(
      parse_request, model_name=self.model_name, max_tokens_per_turn=self.max_tokens_per_turn, max_n=self.max_n
    )
    request = await off_loop(parse, body)
    if self.max_turns is not None and chain.num_requests >= self.max_turns:
      chain.limit_hit = "max_turns"
      raise EndpointError(
        400, f"messages: this chain already made max_turns={self.max_turns} requests", "messages", "max_turns_exceeded"
      )
    lock = self._locks.get(key) or trio.Lock()
    async with lock:
      prompt = await off_loop(self._request_prompt, chain, request)
    prompt_tokens = len(prompt.prompt_ids)  # what the sampler is sent (before any reply is recorded)
    room = self.max_total_tokens - prompt_tokens
    if room <= 0:
      chain.limit_hit = "max_total_tokens"
      raise EndpointError(
        400,
        f"messages: the prompt has {prompt_tokens} tokens, this run's context is {self.max_total_tokens}",
        "messages",
        "context_length_exceeded",
      )
    budget = min(request.max_tokens or self.max_tokens_per_turn, room)
    turn = chain.num_requests
    chain.num_requests += 1
    if request.asked_max_tokens is not None and request.asked_max_tokens > self.max_tokens_per_turn:
      chain.clamped_requests += 1
    chain.note_tool_results(request.raw_messages)
    results: list[Any] = [None] * request.n
    images = prompt.base.prompt_images()

    async def sample(i):
      chain_id = shared_chain_id(chain.chain_id, turn, self.shared_turns)
      seed = _request_seed(self.seed, chain.group_id, chain_id, turn + 1_000_003 * i, self.sampling_params.seed)
      params = self._params(request, budget, seed)
      ids = list(prompt.prompt_ids)
      results[i] = await agenerate_with_images(self.sampler, ids, params, images, prompt.base.routes)

    await self._gather()
    self._sampling += 1
    try:
      if request.n == 1:
        await sample(0)
      else:
        async with trio.open_nursery() as nursery:
          for i in range(request.n):
            nursery.start_soon(sample, i)
    finally:
      self._sampling -= 1
    async with lock:
      choices = [self._choice(chain, prompt, request, turn, i, r, budget) for i, r in enumerate(results)]
    completion_tokens = sum(len(r.token_ids) for r in results)
    return {
      "id": f"chatcmpl-{uuid.uuid4().hex}",
      "object": "chat.completion",
      "created": int(time.time()),
      "model": self.model_name,
      "choices": choices,
      "usage": {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
      },
    }

  def _choice(self, chain, prompt, request, turn, index, result, budget) -> dict:
    agent, tok = self.agent, self.agent.tokenizer
    generated = [int(t) for t in result.token_ids]
    ended = bool(generated) and generated[-1] in self.stop_ids
    text = tok.decode(generated[:-1] if ended else generated)
    parsed = agent.parse(text)
    use_tools = request.tool_choice != "none" and parsed.tool_calls
    parsed_calls = parsed.tool_calls if use_tools else []
    calls = [
      {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
      }
      for c in parsed_calls
    ]
    reply = {"role": "assistant", "content": (parsed.content or None) if calls else text}
    if calls:
      reply["tool_calls"] = calls
    chain.record(
      prompt,
      generated,
      result.logprobs,
      agent.assistant_message(text, parsed),
      message_key(template_message(reply, 0)),
      tok.decode(generated[-1:]) if ended else "",
      getattr(result, "routed_experts", None),
    )
    chain.note_tool_calls(turn, [(c["id"], p.name, p.arguments) for c, p in zip(calls, parsed_calls)])
    chain.last_text = parsed.content if parsed.final_answer is None else parsed.final_answer
    if calls:
      finish = "tool_calls"
    elif not ended and len(generated) >= budget:
      finish = "length"
    else:
      finish = "stop"
    return {"index": index, "message": reply, "finish_reason": finish, "logprobs": None}

  # -- HTTP --------------------------------------------------------------------------------------
  @property
  def app(self):
    """The ASGI app (starlette): POST /v1/chat/completions, GET /v1/models."""
    if self._app is None:
      self._app = _make_app(self)
    return self._app


def _make_app(endpoint: ChatEndpoint):
  from starlette.applications import Starlette
  from starlette.responses import JSONResponse
  from starlette.routing import Route

  def error_response(e: EndpointError):
    return JSONResponse(e.body(), status_code=e.status)

  async def chat_completions(request):
    auth = request.headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-chain-key")
    try:
      endpoint.chain_of(key, request.client.host if request.client else "")  # refused before the body is read
      raw = await read_body(request, endpoint.max_body_bytes)
      return JSONResponse(await endpoint.complete(key, raw))
    except EndpointError as e:
      return error_response(e)
    except Exception as e:  # a sampler failure: the agent sees a 500, other chains go on
      log.warning("endpoint: request of chain %s failed", key_label(key), exc_info=True)
      return error_response(
        EndpointError(500, f"the sampler failed: {type(e).__name__}: {e}", None, "sampler_error", "server_error")
      )

  async def models(request):
    return JSONResponse(
      {
        "object": "list",
        "data": [
          {"id": endpoint.model_name, "object": "model", "created": endpoint.created, "owned_by": "agentfly-jax"}
        ],
      }
    )

  return Starlette(
    routes=[
      Route("/v1/chat/completions", chat_completions, methods=["POST"]),
      Route("/v1/models", models, methods=["GET"]),
    ]
  )


@contextlib.asynccontextmanager
async def serve_endpoint(endpoint: ChatEndpoint, host: str = "127.0.0.1", port: int = 0):
  """Serves `endpoint.app` with hypercorn's trio worker inside the current trio run; yields the
  base URL (`http://127.0.0.1:PORT/v1`, port 0 = a free one) and shuts the server down on exit."""
  from hypercorn.config import Config
  from hypercorn.trio import serve

  config = Config()
  config.bind = [f"{host}:{port}"]
  config.accesslog = None
  config.loglevel = "WARNING"
  config.graceful_timeout = 1.0
  config.keep_alive_timeout = 600.0
  config.backlog = 4096
  shutdown = trio.Event()
  async with trio.open_nursery() as nursery:
    binds = await nursery.start(
      lambda task_status: serve(endpoint.app, config, shutdown_trigger=shutdown.wait, task_status=task_status)
    )
    try:
      yield f"{binds[0]}/v1"
    finally:
      shutdown.set()
