"""Tool-call parsers: model text -> tool calls, or error observations. They never raise.

- `parse_hermes_tool_calls`: Qwen/Hermes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks, any number per turn.
- `parse_react`: `Thought: ... / Action: name / Action Input: {json}` (one action per turn) or
  `Final Answer: ...`.
- `parse_code_blocks`: ```python fenced blocks, joined into one call of the code tool.

A malformed call does not stop anything: it becomes an entry in `ParsedTurn.errors`, which the
agent shows the model as an error observation.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_CODE_RE = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_FINAL_ANSWER_RE = re.compile(r"Final Answer\s*:\s*(.*)", re.DOTALL)


@dataclasses.dataclass
class ToolCall:
  """One parsed call. `arguments` is a dict; `raw_arguments` holds non-JSON text (ReAct)."""

  name: str
  arguments: dict[str, Any]
  raw_arguments: str | None = None

  def as_message_call(self) -> dict:
    """The OpenAI/HF message form: {"type": "function", "function": {"name", "arguments"}}."""
    return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass
class ParsedTurn:
  """What one model turn asked for.

  Attributes:
    content: the text outside tool-call blocks (stripped).
    tool_calls: well-formed calls, in order.
    errors: one message per malformed call (shown to the model as error observations).
    final_answer: an explicit final answer (ReAct/Code `Final Answer:`), if any.
  """

  content: str
  tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
  errors: list[str] = dataclasses.field(default_factory=list)
  final_answer: str | None = None


def _load_json(text: str) -> tuple[Any, str | None]:
  try:
    return json.loads(text), None
  except (ValueError, RecursionError) as e:
    return None, f"{type(e).__name__}: {str(e)[:200]}"


def _call_from_object(obj: Any, where: str) -> tuple[ToolCall | None, str | None]:
  if not isinstance(obj, dict):
    return None, f"{where}: expected a JSON object, got {type(obj).__name__}"
  name = obj.get("name")
  if not isinstance(name, str) or not name.strip():
    return None, f"{where}: missing a string field 'name'"
  arguments = obj.get("arguments", obj.get("parameters", {}))
  if isinstance(arguments, str):  # some models double-encode the arguments
    decoded, err = _load_json(arguments) if arguments.strip() else ({}, None)
    if err is not None or not isinstance(decoded, dict):
      return None, f"{where}: 'arguments' of '{name}' is a string that is not a JSON object"
    arguments = decoded
  if arguments is None:
    arguments = {}
  if not isinstance(arguments, dict):
    return None, f"{where}: 'arguments' of '{name}' must be a JSON object, got {type(arguments).__name__}"
  return ToolCall(name=name.strip(), arguments=arguments), None


def parse_hermes_tool_calls(text: str) -> ParsedTurn:
  """Parses `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; a block may also
  hold a JSON list of such objects (the SmolLM2 / xLAM function-calling style).

  An unclosed last `<tool_call>` is parsed up to the end of the text.
  """
  text = "" if text is None else str(text)
  calls, errors = [], []
  spans = [(m.start(), m.end(), m.group(1)) for m in _TOOL_CALL_RE.finditer(text)]
  last_end = spans[-1][1] if spans else 0
  tail_open = text.find("<tool_call>", last_end)
  if tail_open >= 0:
    spans.append((tail_open, len(text), text[tail_open + len("<tool_call>") :]))
  for i, (_, _, body) in enumerate(spans):
    where = f"tool call #{i + 1}"
    obj, err = _load_json(body.strip())
    if err is not None:
      errors.append(
        f"{where} is not valid JSON ({err}); write "
        '<tool_call>{"name": <tool name>, "arguments": {...}}</tool_call>'
      )
      continue
    for j, item in enumerate(obj if isinstance(obj, list) else [obj]):  # a call, or a list ([] = none)
      call, err = _call_from_object(item, where if not isinstance(obj, list) else f"{where}, item {j + 1}")
      if err is not None:
        errors.append(err)
      else:
        calls.append(call)
  pieces, pos = [], 0
  for start, end, _ in spans:
    pieces.append(text[pos:start])
    pos = end
  pieces.append(text[pos:])
  content = "".join(pieces).strip()
  return ParsedTurn(content=content, tool_calls=calls, errors=errors)


def parse_react(text: str) -> ParsedTurn:
  """Parses one ReAct step: `Action: <name>` + `Action Input: <json or text>`, or
  `Final Answer: <text>`. Text after a model-written `Observation:` is ignored."""
  text = "" if text is None else str(text)
  obs = re.search(r"^[ \t]*Observation[ \t]*:", text, re.MULTILINE)
  step = text[: obs.start()] if obs else text
  action = re.search(r"^[ \t]*Action[ \t]*:[ \t]*(.*?)[ \t]*$", step, re.MULTILINE)
  if action is None:
    final = _FINAL_ANSWER_RE.search(step)
    answer = final.group(1).strip() if final else None
    return ParsedTurn(content=step.strip(), final_answer=answer)
  name = action.group(1).strip().strip("`'\"")
  after = step[action.end() :]
  action_input = re.search(r"^[ \t]*Action Input[ \t]*:\s*(.*)", after, re.MULTILINE | re.DOTALL)
  if not name:
    return ParsedTurn(content=step.strip(), errors=["'Action:' names no tool"])
  if action_input is None:
    return ParsedTurn(content=step.strip(), tool_calls=[ToolCall(name=name, arguments={})])
  raw = action_input.group(1).strip()
  if raw.startswith("```"):
    raw = raw.strip("`").strip()
    if raw.startswith("json"):
      raw = raw[4:].strip()
  if not raw:
    return ParsedTurn(content=step.strip(), tool_calls=[ToolCall(name=name, arguments={})])
  obj, err = _load_json(raw)
  if err is None and isinstance(obj, dict):
    return ParsedTurn(content=step.strip(), tool_calls=[ToolCall(name=name, arguments=obj)])
  return ParsedTurn(content=step.strip(), tool_calls=[ToolCall(name=name, arguments={}, raw_arguments=raw)])


def parse_code_blocks(text: str, tool_name: str = "code_interpreter", argument: str = "code") -> ParsedTurn:
  """Joins all ```python blocks of a turn into one call `tool_name(argument=code)`; an
  unclosed last block runs to the end of the text. `Final Answer:` outside code is kept."""
  text = "" if text is None else str(text)
  blocks = [m.group(1) for m in _CODE_RE.finditer(text)]
  prose = _CODE_RE.sub("", text)
  final = _FINAL_ANSWER_RE.search(prose)
  answer = final.group(1).strip() if final else None
  blocks = [b.strip("\n") for b in blocks if b.strip()]
  if not blocks:
    return ParsedTurn(content=text.strip(), final_answer=answer)
  call = ToolCall(name=tool_name, arguments={argument: "\n".join(blocks)})
  return ParsedTurn(content=text.strip(), tool_calls=[call], final_answer=answer)
