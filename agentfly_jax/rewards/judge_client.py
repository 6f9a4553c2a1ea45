"""Judge models: chat messages in, reply text out; reached over an OpenAI-compatible URL or run in this process.

    client = OpenAIJudge("http://127.0.0.1:8000/v1", model="judge")      # any vLLM / OpenAI server
    client = SamplerJudge(sampler, tokenizer)      # agents/sampler_judge.py: a second model on its own sampler
    calls = JudgeCalls(client, max_concurrency=8, timeout_s=60, retries=2, cache_size=4096)
    text, cached = await calls.reply(messages)                           # under trio (the rollout's loop)

`JudgeCalls` is the policy around a client: at most `max_concurrency` calls in flight, each attempt cut at
`timeout_s`, `retries` more attempts after a failure (backoff 0.5 s, 1 s, 2 s, ...), and a cache of replies
keyed by the client and the exact messages: the same prediction (same prompt) is judged once, and a request
equal to one in flight waits for its reply instead of calling again. A call that fails every attempt raises
`JudgeError` (the chain then fails and counts toward rollout.max_error_share: a judge that is gone stops the
run instead of scoring silently). `check_url` probes a URL before training.
"""

from __future__ import annotations

import collections
import hashlib
import json
import time
from typing import Any, Protocol

import trio


class JudgeError(RuntimeError):
  """A judge call failed every attempt (timeouts, refused connections, server errors)."""


class JudgeClient(Protocol):
  key: str  # the judge's identity in the cache (URL + model, or the in-process model's name)

  async def complete(self, messages: list[dict], schema: dict | None = None) -> str:
    """The reply to `messages`; `schema`: the JSON schema the reply should follow (a client may constrain its
    decoding to it, or ignore it)."""
    ...


class _PerRun:
  """One object per trio run (an HTTP client's connections and a limiter's waiters belong to one event loop;
  each rollout is its own trio.run)."""

  def __init__(self, factory):
    self._factory, self._token, self._value = factory, None, None

  def get(self):
    token = trio.lowlevel.current_trio_token()
    if token is not self._token:
      self._token, self._value = token, self._factory()
    return self._value


class OpenAIJudge:
  """A judge behind an OpenAI-compatible chat-completions URL (`base_url` ends in /v1), through the `openai`
  SDK's AsyncOpenAI (its own retries off: `JudgeCalls` retries). `json_mode`: the reply constrained to the
  reward's JSON schema (response_format json_schema: vLLM's structured outputs), or to any JSON object when there
  is none; `extra_body` goes into every request."""

  def __init__(
    self,
    base_url: str,
    model: str,
    *,
    api_key: str = "EMPTY",
    temperature: float = 0.0,
    max_tokens: int = 256,
    json_mode: bool = False,
    extra_body: dict | None = None,
  ):
    self.base_url, self.model = base_url.rstrip("/"), model
    self.api_key, self.temperature, self.max_tokens = api_key, temperature, max_tokens
    self.json_mode, self.extra_body = json_mode, dict(extra_body or {})
    self.key = f"openai:{self.base_url}:{model}:{temperature}:{max_tokens}:{json_mode}:{sorted(self.extra_body)}"
    import openai  # here, not inside a call's timeout (its first import takes seconds)

    self._openai = openai
    self._client = _PerRun(self._new_client)

  def _new_client(self):
    return self._openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=None)

  async def complete(self, messages: list[dict], schema: dict | None = None) -> str:
    kwargs: dict[str, Any] = dict(model=self.model, messages=messages, temperature=self.temperature)
    kwargs["max_tokens"] = self.max_tokens
    if self.json_mode and schema is not None:
      kwargs["response_format"] = {"type": "json_schema", "json_schema": {"name": "judgement", "schema": schema}}
    elif self.json_mode:
      kwargs["response_format"] = {"type": "json_object"}
    if self.extra_body:
      kwargs["extra_body"] = self.extra_body
    response = await self._client.get().chat.completions.create(**kwargs)
    return response.choices[0].message.content or ""


def messages_key(client_key: str, messages: list[dict], schema: dict | None = None) -> str:
  return hashlib.sha256(json.dumps([client_key, messages, schema], sort_keys=True).encode()).hexdigest()


class JudgeCalls:
  """Concurrency limit, per-attempt timeout, retries and a reply cache around a `JudgeClient` (see the module
  docstring). Counters: `calls` (requests sent), `hits` (replies from the cache or a request in flight),
  `failures` (attempts that failed), `latency_s` (seconds of the sent requests)."""

  def __init__(
    self,
    client: JudgeClient,
    *,
    max_concurrency: int = 16,
    timeout_s: float = 120.0,
    retries: int = 2,
    backoff_s: float = 0.5,
    cache_size: int = 4096,
  ):
    for name, value, low in (
      ("max_concurrency", max_concurrency, 1),
      ("retries", retries, 0),
      ("cache_size", cache_size, 0),
    ):
      if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"JudgeCalls: {name} must be an integer >= {low}, got {value!r}")
    if not timeout_s > 0:
      raise ValueError(f"JudgeCalls: timeout_s must be > 0, got {timeout_s!r}")
    self.client, self.timeout_s, self.retries, self.backoff_s = client, float(timeout_s), retries, backoff_s
    self.cache_size = cache_size
    self._cache: collections.OrderedDict[str, str] = collections.OrderedDict()
    self._inflight: dict[str, trio.Event] = {}
    self._limiter = _PerRun(lambda: trio.CapacityLimiter(max_concurrency))
    self.calls = self.hits = self.failures = 0
    self.latency_s = 0.0

  async def reply(self, messages: list[dict], schema: dict | None = None) -> tuple[str, bool]:
    """(the judge's reply to `messages` (`schema`: the JSON schema asked for), whether it came without a request
    of its own)."""
    key = messages_key(self.client.key, messages, schema)
    while key in self._inflight:  # an equal request is being sent: its reply, unless it failed
      await self._inflight[key].wait()
    if key in self._cache:
      self._cache.move_to_end(key)
      self.hits += 1
      return self._cache[key], True
    done = self._inflight[key] = trio.Event()
    try:
      text = await self._call(messages, schema)
      if self.cache_size:
        self._cache[key] = text
        while len(self._cache) > self.cache_size:
          self._cache.popitem(last=False)
      return text, False
    finally:
      del self._inflight[key]
      done.set()

  async def _call(self, messages: list[dict], schema: dict | None) -> str:
    last = None
    for attempt in range(self.retries + 1):
      async with self._limiter.get():
        start = time.perf_counter()
        try:
          self.calls += 1
          with trio.fail_after(self.timeout_s):
            text = await self.client.complete(messages, schema)
          self.latency_s += time.perf_counter() - start
          return text
        except trio.TooSlowError:
          last = f"no reply within timeout_s={self.timeout_s:g}"
        except Exception as e:  # noqa: BLE001 - a refused connection, a 5xx, a malformed response: retried
          last = f"{type(e).__name__}: {e}"
      self.failures += 1
      if attempt < self.retries:
        await trio.sleep(self.backoff_s * 2**attempt)
    raise JudgeError(f"judge {self.client.key}: {self.retries + 1} attempts failed; last: {last}")


def served_models(base_url: str, *, api_key: str = "EMPTY", timeout_s: float = 10.0) -> list[str]:
  """The model ids an OpenAI-compatible server lists at GET {base_url}/models (raises on no answer)."""
  import httpx

  response = httpx.get(
    f"{base_url.rstrip('/')}/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s
  )
  response.raise_for_status()
  return [m["id"] for m in response.json().get("data", [])]


def check_url(base_url: str, model: str, *, field: str, model_field: str, api_key: str = "EMPTY") -> str:
  """The model to ask at `base_url`: `model`, checked to be served, or ("") the first served; ValueError naming
  `field` when nothing OpenAI-compatible answers there, `model_field` when the model is not served."""
  try:
    models = served_models(base_url, api_key=api_key)
  except Exception as e:  # noqa: BLE001 - refused, timed out, not JSON, 404: no judge there
    raise ValueError(
      f"config.{field}={base_url!r}: no OpenAI-compatible server answers there (GET {base_url.rstrip('/')}/models: "
      f"{type(e).__name__}: {e})"
    ) from None
  if model and model not in models:
    raise ValueError(f"config.{model_field}={model!r}: the judge server at {base_url} serves {models}, not this model")
  if not models:
    raise ValueError(f"config.{field}={base_url!r}: the server lists no model (GET /models)")
  return model or models[0]
