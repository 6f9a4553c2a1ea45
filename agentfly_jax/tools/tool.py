"""`@tool`: turn a Python function into a tool an agent can call.

  @tool
  def get_weather(city: str, days: int = 1) -> str:
    '''Weather forecast for a city.

    Args:
      city: the city name.
      days: how many days ahead.
    '''
    return f"{city}: sunny for {days} day(s)"

  get_weather(city="Oslo")              # direct, synchronous call -> "Oslo: sunny for 1 day(s)"
  await get_weather.acall(city="Oslo")  # or awaited inside trio (also `await get_weather(...)`)
  get_weather.schema                    # OpenAI function-format JSON schema

Sync and async (trio) functions both work; sync ones run in a worker thread so that several
calls of one turn run concurrently. In a rollout every problem becomes an error observation the
model reads, never an exception: the function raising, an unknown argument, a missing argument,
a wrong type, a timeout. Output longer than `max_length` characters is cut with a visible marker.

A finish tool (`@tool(finish=True)`, e.g. `answer`) ends the chain; its output is the chain's
prediction. A tool that returns its environment's `StepResult` (not only the observation) ends the
chain when the step says `done` (the shop's purchase, a text game's end, a SWE submission). A stateful tool (`@tool(stateful=True, env="python_sandbox")`) takes a parameter
named `env` and receives the chain's environment instance (the same instance for every call of
the chain); called directly it gets a fresh environment of its own.

Limits (`tools/limits.py`): `@tool(max_concurrency=2, rate=(5, 1.0))` lets at most 2 calls run at
once and at most 5 start in any second, across all chains of the process; every call is counted
per tool (calls, errors, seconds waited for the limits) for the trainer's step metrics.

Images: a tool may return a PIL image, a uint8 numpy array (H x W x 3), encoded image bytes, or a list
mixing text and images; `ToolOutput.content` then holds them as content parts (decoded and bounded by
agentfly_jax/vision) for the next observation message. An image that does not decode is an error
observation naming the tool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import typing
import uuid
from typing import Any, Callable

import sniffio
import trio

from agentfly_jax.envs.provider import get_env_provider, set_env_provider  # noqa: F401 (re-exported)
from agentfly_jax.tools.limits import ToolLimits
from agentfly_jax.tools.schema import check_arguments, function_schema
from agentfly_jax.tools.trio_host import call_from_asyncio
from agentfly_jax.vision.content import content_text, to_content_parts
from agentfly_jax.vision.decode import ImageError

DEFAULT_MAX_LENGTH = 4096
ENV_PARAM = "env"


@dataclasses.dataclass
class ToolOutput:
  """Result of one tool call: what the model reads, and whether it went well. `content` is set when the
  tool returned an image (alone or in a list with text): the observation message's content parts
  (agentfly_jax/vision/content.py), images decoded to RGB; `observation` is then its text view."""

  observation: str
  ok: bool = True
  error: str | None = None
  finished: bool = False
  episode_done: bool = False  # the tool returned its environment's step result with done=True
  reward: float | None = None  # the reward of the environment step result the tool returned, if any
  content: list | None = None  # content parts with images (None: text only)


def to_observation_text(value: Any) -> str:
  """A tool's return value as text: str as is, StepResult -> its observation, JSON for
  dicts/lists, str() otherwise."""
  if value is None:
    return ""
  if isinstance(value, str):
    return value
  observation = getattr(value, "observation", None)
  if isinstance(observation, str):
    return observation
  if isinstance(observation, list) and all(isinstance(p, dict) and "type" in p for p in observation):
    return content_text(observation)  # an environment's content parts
  if isinstance(value, (dict, list, tuple, int, float, bool)):
    try:
      return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
      pass
  return str(value)


def _says_done(value: Any) -> bool:
  """True when a tool returned an environment step result (an object with a str `observation`)
  whose `done` is True: the episode is over (a purchase, a game won or lost, a submission)."""
  return isinstance(getattr(value, "observation", None), (str, list)) and bool(getattr(value, "done", False))


def _step_reward(value: Any) -> float | None:
  """The numeric `reward` of an environment step result a tool returned (an object with a str
  `observation`), else None."""
  reward = getattr(value, "reward", None) if isinstance(getattr(value, "observation", None), (str, list)) else None
  return float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None


def truncate(text: str, max_length: int | None) -> str:
  """Cuts `text` to `max_length` characters plus a marker saying how much was dropped."""
  if max_length is None or len(text) <= max_length:
    return text
  return f"{text[:max_length]}\n...[truncated: {len(text) - max_length} more characters]"


class Tool:
  """A callable tool: the function, its JSON schema, and how it runs in a chain."""

  def __init__(
    self,
    fn: Callable,
    *,
    name: str | None = None,
    description: str | None = None,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    stateful: bool = False,
    env: str | None = None,
    finish: bool = False,
    timeout_s: float | None = None,
    max_concurrency: int | None = None,
    rate: tuple[int, float] | None = None,
    schema: dict | None = None,
  ):
    if not callable(fn):
      raise TypeError(f"@tool: expected a function, got {type(fn).__name__}")
    self.fn = fn
    self.name = name or fn.__name__
    self.signature = inspect.signature(fn)
    params = self.signature.parameters
    self.stateful = bool(stateful or env is not None)
    self.env_name = env
    if self.stateful:
      if not env:
        raise ValueError(f"@tool {self.name!r}: stateful=True needs env='<env name>'")
      if ENV_PARAM not in params:
        raise ValueError(
          f"@tool {self.name!r}: a stateful tool needs a parameter named '{ENV_PARAM}' to receive its environment"
        )
    self._skip = (ENV_PARAM,) if self.stateful else ()
    try:
      self._hints = typing.get_type_hints(fn)
    except Exception:
      self._hints = {}
    # `schema`: given for tools whose arguments are not the function's (MCP tools: **kwargs).
    self.schema = (
      schema
      if schema is not None
      else function_schema(fn, name=self.name, description=description, skip_params=self._skip)
    )
    self._fixed_schema = schema is not None
    self.description = self.schema["function"]["description"]
    self.max_length = max_length
    self.is_finish = bool(finish)
    self.timeout_s = timeout_s
    self.is_async = inspect.iscoroutinefunction(fn)
    self.limits = ToolLimits(self.name, max_concurrency, rate)
    functools.update_wrapper(self, fn)

  @property
  def parameters(self) -> dict:
    """The JSON schema of the arguments ({"type": "object", "properties": ..., "required": ...})."""
    return self.schema["function"]["parameters"]

  def __repr__(self):
    kind = "finish " if self.is_finish else ""
    env = f", env={self.env_name!r}" if self.stateful else ""
    return f"<{kind}Tool {self.name}({', '.join(self.parameters['properties'])}){env}>"

  def check(self, arguments: Any) -> str | None:
    """An error message if `arguments` don't fit the signature, else None."""
    if not isinstance(arguments, dict):
      return f"tool '{self.name}' arguments must be a JSON object, got {type(arguments).__name__} {arguments!r:.80}"
    if self._fixed_schema:
      return _check_against_schema(self.name, self.parameters, arguments)
    return check_arguments(self.name, self.signature, self._hints, arguments, self._skip)

  async def run(
    self, arguments: Any, env: Any = None, thread_limiter: trio.CapacityLimiter | None = None
  ) -> ToolOutput:
    """Runs the tool once in a chain; never raises (except trio cancellation): any problem
    comes back as an error observation. Waits for the tool's limits first (counted)."""
    async with self.limits.slot():
      out = await self._run_once(arguments, env, thread_limiter)
    self.limits.count(out.ok)
    return out

  async def _run_once(self, arguments: Any, env: Any, thread_limiter: trio.CapacityLimiter | None) -> ToolOutput:
    error = self.check(arguments)
    if error is not None:
      return ToolOutput(f"Error: {error}", ok=False, error=error)
    kwargs = dict(arguments)
    if self.stateful:
      if env is None:
        error = f"tool '{self.name}' needs environment '{self.env_name}' but none was provided"
        return ToolOutput(f"Error: {error}", ok=False, error=error)
      kwargs[ENV_PARAM] = env
    try:
      with trio.fail_after(self.timeout_s) if self.timeout_s else contextlib.nullcontext():
        if self.is_async:
          value = await self.fn(**kwargs)
        else:
          value = await trio.to_thread.run_sync(
            functools.partial(self.fn, **kwargs), limiter=thread_limiter, abandon_on_cancel=True
          )
    except trio.TooSlowError:
      error = f"tool '{self.name}' timed out after {self.timeout_s} s"
      return ToolOutput(f"Error: {error}", ok=False, error=error)
    except Exception as e:  # the model reads the error and may retry
      error = f"tool '{self.name}' raised {type(e).__name__}: {e}"
      return ToolOutput(truncate(f"Error: {error}", self.max_length), ok=False, error=error)
    try:
      content = to_content_parts(getattr(value, "observation", value), f"tool '{self.name}' result")
    except ImageError as e:
      error = f"tool '{self.name}' returned an unusable image: {e}"
      return ToolOutput(truncate(f"Error: {error}", self.max_length), ok=False, error=error)
    if content is not None:
      for part in content:  # the text parts, each within the tool's limit
        if part["type"] == "text":
          part["text"] = truncate(part["text"], self.max_length)
    return ToolOutput(
      truncate(content_text(content) if content is not None else to_observation_text(value), self.max_length),
      content=content,
      ok=True,
      finished=self.is_finish,
      episode_done=_says_done(value),
      reward=_step_reward(value),
    )

  def _arguments(self, args: tuple, kwargs: dict) -> dict:
    """Positional + keyword arguments of a direct call as one dict (positional ones bound to the
    signature's parameters in order)."""
    if not args:
      return kwargs
    names = [
      k
      for k, p in self.signature.parameters.items()
      if k not in self._skip and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(args) > len(names):
      raise TypeError(f"tool '{self.name}' takes {len(names)} positional argument(s), got {len(args)}")
    return {**dict(zip(names, args)), **kwargs}

  async def acall(self, *args, **kwargs) -> str:
    """Direct call outside a rollout, awaited inside trio; returns the observation text (an
    error observation if something went wrong). Stateful tools get a fresh environment. Awaited
    in asyncio (an asyncio agent's chain): run in the hosting trio run (tools/trio_host.py)."""
    if sniffio.current_async_library() == "asyncio":
      return await call_from_asyncio(self.acall, *args, **kwargs)
    arguments = self._arguments(args, kwargs)
    if not self.stateful:
      return (await self.run(arguments)).observation
    provider = get_env_provider()
    chain_id = f"direct-{self.name}-{uuid.uuid4().hex[:12]}"
    env = await provider.acquire(self.env_name, chain_id)
    try:
      await env.reset(None)
      return (await self.run(arguments, env=env)).observation
    finally:
      with trio.CancelScope(shield=True):
        await provider.release(self.env_name, chain_id)

  def __call__(self, *args, **kwargs):
    """Direct call. Outside trio (a script, a notebook cell): runs `acall` in its own trio loop
    and returns the text. Inside a trio task: returns the `acall` coroutine, so write
    `await my_tool(...)` there."""
    try:
      trio.lowlevel.current_task()
    except RuntimeError:
      return trio.run(functools.partial(self.acall, *args, **kwargs))
    return self.acall(*args, **kwargs)


def tool(
  fn: Callable | None = None,
  *,
  name: str | None = None,
  description: str | None = None,
  max_length: int | None = DEFAULT_MAX_LENGTH,
  stateful: bool = False,
  env: str | None = None,
  finish: bool = False,
  timeout_s: float | None = None,
  max_concurrency: int | None = None,
  rate: tuple[int, float] | None = None,
):
  """Decorator making a `Tool`; use bare (`@tool`) or with options (`@tool(name=..., ...)`).

  Args:
    name: tool name the model uses (default: the function name).
    description: default: the docstring's summary.
    max_length: output characters kept (None = no limit); longer output gets a marker.
    stateful: the tool needs an environment instance (requires `env`).
    env: environment name, e.g. "python_sandbox"; implies stateful. The function must take a
      parameter named `env`.
    finish: calling this tool ends the chain; its output becomes the prediction.
    timeout_s: wall-clock limit per call; exceeding it gives an error observation.
    max_concurrency: at most this many calls of the tool run at once (None = no cap); more wait.
    rate: (calls, seconds): at most `calls` calls start in any `seconds` window; more wait.
  """

  def wrap(f):
    return Tool(
      f,
      name=name,
      description=description,
      max_length=max_length,
      stateful=stateful,
      env=env,
      finish=finish,
      timeout_s=timeout_s,
      max_concurrency=max_concurrency,
      rate=rate,
    )

  return wrap(fn) if fn is not None else wrap


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def _check_against_schema(name: str, parameters: dict, arguments: dict) -> str | None:
  """Required arguments present, no unknown ones (unless additionalProperties), top-level JSON
  types right; an error message naming the argument, else None."""
  props = parameters.get("properties") or {}
  missing = [k for k in parameters.get("required") or () if k not in arguments]
  if missing:
    return f"tool '{name}' is missing required argument(s) {missing}"
  if parameters.get("additionalProperties", True) is False:
    unknown = [k for k in arguments if k not in props]
    if unknown:
      return f"tool '{name}' got unknown argument(s) {unknown}; it takes {sorted(props)}"
  for key, value in arguments.items():
    kind = (props.get(key) or {}).get("type")
    expected = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
    if expected is None:
      continue
    bad = not isinstance(value, expected) or (kind in ("integer", "number") and isinstance(value, bool))
    if bad:
      return f"tool '{name}' argument '{key}' must be of JSON type {kind}, got {type(value).__name__}"
  return None
