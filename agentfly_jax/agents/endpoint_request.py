"""A chat-completions request, from its bytes to a checked `ChatRequest`, for the endpoint (agents/endpoint.py).

  raw = await read_body(request, max_bytes)                 # 413 past max_bytes, read chunk by chunk
  chat = parse_request(raw, model_name="policy", max_tokens_per_turn=256, max_n=1)   # 400 naming the field

Every malformed field is an `EndpointError` (HTTP status, the message naming the field, OpenAI's
`{"error": {"message", "type", "param", "code"}}` body), never an exception of ours: a body that is not
JSON, JSON nested deeper than `MAX_JSON_DEPTH` (also where Python's own parser would recurse past its
limit), a wrong type or shape of model, stream, messages (each message's role, content, name,
tool_call_id, tool_calls and their id / function / arguments), tools, tool_choice, temperature,
max_tokens, n. `parse_request` is pure CPU work on a possibly large body: the endpoint runs it in a
worker thread, off the event loop the other chains' requests share.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from agentfly_jax.agents.endpoint_records import template_message

TOOL_CHOICES = ("auto", "none", "required")
MAX_JSON_DEPTH = 64  # nesting of objects / arrays in a body (a tool's JSON schema is far shallower)


class EndpointError(Exception):
  """An OpenAI-style error reply: HTTP status + error.message (naming the field) / param / code."""

  def __init__(
    self,
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    kind: str = "invalid_request_error",
  ):
    super().__init__(message)
    self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass
class ChatRequest:
  raw_messages: list  # as sent (tool results are paired with their calls from these)
  messages: list[dict]  # in the form the chat template renders
  tools: list[dict] | None
  tool_choice: Any
  temperature: float | None
  max_tokens: int | None  # clamped to the run's per-turn limit
  asked_max_tokens: int | None  # as sent
  n: int


async def read_body(request, max_bytes: int) -> bytes:
  """The body of a starlette request, read chunk by chunk; 413 as soon as it is over `max_bytes` (a
  Content-Length over it is refused before any byte is read)."""
  declared = request.headers.get("content-length")
  too_big = EndpointError(
    413, f"the request body is over this endpoint's limit of {max_bytes} bytes", None, "request_too_large"
  )
  if declared is not None and declared.isdigit() and int(declared) > max_bytes:
    raise too_big
  chunks, size = [], 0
  async for chunk in request.stream():
    size += len(chunk)
    if size > max_bytes:
      raise too_big
    chunks.append(chunk)
  return b"".join(chunks)


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
  """The path of the first object / array nested deeper than `limit` levels in a parsed body (its first 120
  characters; None: none is); iterative, so any depth is safe to check."""
  todo = [(value, "body", 1)]
  while todo:
    item, path, depth = todo.pop()
    if isinstance(item, (dict, list)):
      if depth > limit:
        return path if len(path) <= 120 else path[:120] + "…"
      pairs = item.items() if isinstance(item, dict) else enumerate(item)
      for k, v in pairs:
        if isinstance(v, (dict, list)):
          todo.append((v, f"{path}.{k}" if isinstance(item, dict) else f"{path}[{k}]", depth + 1))
  return None


def parse_json(raw: bytes) -> Any:
  """The body's JSON; 400 for bytes that are not JSON or nest deeper than MAX_JSON_DEPTH."""
  try:
    body = json.loads(raw)
  except RecursionError:
    raise EndpointError(
      400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels", None, "json_too_deep"
    ) from None
  except ValueError as e:
    raise EndpointError(400, f"the request body is not valid JSON: {e}", None, "invalid_json") from None
  path = too_deep(body)
  if path is not None:
    raise EndpointError(
      400, f"{path}: the request body nests deeper than {MAX_JSON_DEPTH} levels", path, "json_too_deep"
    )
  return body


def _check_tools(tools: Any) -> list[dict] | None:
  if tools is None:
    return None
  if not isinstance(tools, list):
    raise EndpointError(400, f"tools must be a list, got {type(tools).__name__}", "tools")
  for j, t in enumerate(tools):
    fn = t.get("function") if isinstance(t, dict) else None
    ok = (
      isinstance(t, dict)
      and t.get("type", "function") == "function"
      and isinstance(fn, dict)
      and isinstance(fn.get("name"), str)
      and fn["name"]
    )
    if not ok:
      raise EndpointError(
        400,
        f"tools[{j}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}, "
        f"got {str(t)[:120]}",
        f"tools[{j}]",
      )
    if not isinstance(fn.get("parameters", {}), dict):
      raise EndpointError(
        400, f"tools[{j}].function.parameters must be a JSON schema object", f"tools[{j}].function.parameters"
      )
    if not isinstance(fn.get("description", ""), str):
      raise EndpointError(400, f"tools[{j}].function.description must be a string", f"tools[{j}].function.description")
  return tools or None


def _check_tool_choice(choice: Any) -> Any:
  if choice is None or (isinstance(choice, str) and choice in TOOL_CHOICES):
    return choice
  fn = choice.get("function") if isinstance(choice, dict) else None
  if isinstance(choice, dict) and choice.get("type", "function") == "function" and isinstance(fn, dict):
    if isinstance(fn.get("name"), str) and fn["name"]:
      return choice
  where = "tool_choice.function" if isinstance(choice, dict) and "function" in choice else "tool_choice"
  raise EndpointError(
    400,
    f"{where}: tool_choice must be one of {list(TOOL_CHOICES)} or "
    f"{{'type': 'function', 'function': {{'name': ...}}}}, got {str(choice)[:120]}",
    where,
  )


def _check_messages(raw: Any) -> list[dict]:
  if not isinstance(raw, list) or not raw:
    raise EndpointError(400, f"messages must be a non-empty list of messages, got {str(raw)[:80]}", "messages")
  try:
    return [template_message(m, i) for i, m in enumerate(raw)]
  except ValueError as e:
    raise EndpointError(400, str(e), str(e).split(" ", 1)[0].rstrip(":")) from None


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_request(raw: bytes | Any, *, model_name: str, max_tokens_per_turn: int, max_n: int) -> ChatRequest:
  """The checked request of a body (bytes, or already parsed JSON); EndpointError naming the bad field."""
  body = parse_json(raw) if isinstance(raw, (bytes, bytearray)) else raw
  if not isinstance(body, dict):
    raise EndpointError(400, f"the request body must be a JSON object, got {type(body).__name__}")
  if body.get("model") != model_name:
    raise EndpointError(
      404,
      f"model: {str(body.get('model'))[:80]!r} does not exist; this endpoint serves [{model_name!r}]",
      "model",
      "model_not_found",
    )
  if body.get("stream"):
    raise EndpointError(
      400, "stream: streaming replies are not supported; send stream=false", "stream", "unsupported_parameter"
    )
  messages = _check_messages(body.get("messages"))
  tools = _check_tools(body.get("tools"))
  choice = _check_tool_choice(body.get("tool_choice"))
  temperature = body.get("temperature")
  if temperature is not None and not (_number(temperature) and 0 <= temperature <= 2):
    raise EndpointError(400, f"temperature must be a number in [0, 2], got {str(temperature)[:40]}", "temperature")
  field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
  asked = body.get(field)
  if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
    raise EndpointError(400, f"{field} must be an integer >= 1, got {str(asked)[:40]}", field)
  n = body.get("n") if body.get("n") is not None else 1
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise EndpointError(400, f"n must be an integer >= 1, got {str(n)[:40]}", "n")
  if n > max_n:
    raise EndpointError(400, f"n={n} is over this run's limit of {max_n} choice(s) per request", "n")
  max_tokens = None if asked is None else min(asked, max_tokens_per_turn)  # clamped (counted), never a 400
  return ChatRequest(body["messages"], messages, tools, choice, temperature, max_tokens, asked, n)
