"""`PromptedToolCallAgent`: tool schemas written into the system prompt, for models whose chat
template ignores `tools` (SmolLM2's template only writes role + content; a `ToolCallAgent` on it
would send the model no schema at all).

  agent = PromptedToolCallAgent(tok_dir, tools=[calculator], reward_fn=numeric_match,
                                tool_format="json_list")

Formats (`TOOL_FORMATS`; measured on SmolLM2-135M-Instruct by lab/bench/measure_tool_formats.py):
- "hermes": the tools as JSON in `<tools>...</tools>`, one call per `<tool_call>{...}</tool_call>`.
- "json_list": the function-calling prompt style of SmolLM2's instruct mix: the tools as a JSON
  list and the calls as one JSON list `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`.
- "brief": one line per tool (`name(arg: type): description`) and the hermes call syntax: a short
  prompt (cheap to train on) for a model taught the format by SFT.
Both are parsed by `parse_hermes_tool_calls` (a block may hold one call object or a list of them).
The assistant message keeps the model's raw text (so the template renders exactly the sampled
text) and tool outputs come back as a user message `<tool_response>...</tool_response>`
(the template has no tool role).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from agentfly_jax.agents.agents import ToolCallAgent
from agentfly_jax.agents.base import observation_content
from agentfly_jax.vision.content import framed, join_content
from agentfly_jax.agents.parsers import ParsedTurn, ToolCall
from agentfly_jax.rewards.reward import Reward
from agentfly_jax.tools.tool import Tool, ToolOutput

HERMES_INSTRUCTIONS = """You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>
The result comes back within <tool_response></tool_response> tags. Then answer the user."""

JSON_LIST_INSTRUCTIONS = """You are an expert in composing functions. You are given a question and a set of possible functions. Based on the question, you will need to make one or more function/tool calls to achieve the purpose.

You have access to the following tools:
<tools>{tools}</tools>

The output MUST strictly adhere to the following format, and NO other text MUST be included.
The example format is as follows. Please make sure the parameter type is correct.
<tool_call>[
{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}}
]</tool_call>
The result comes back within <tool_response></tool_response> tags. Then answer the user."""

BRIEF_INSTRUCTIONS = """Tools:
{tools}
Call a tool as <tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call> and its result comes back within <tool_response></tool_response> tags."""

TOOL_FORMATS = {"hermes": HERMES_INSTRUCTIONS, "json_list": JSON_LIST_INSTRUCTIONS, "brief": BRIEF_INSTRUCTIONS}


def _function_schema(t: Tool) -> dict:
  return {"name": t.name, "description": t.description, "parameters": t.parameters}


def _signature(schema: dict) -> str:
  """'name(arg: type, ...): description' — one line per tool (the "brief" format)."""
  props = schema["parameters"].get("properties", {})
  args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
  return f"{schema['name']}({args}): {schema['description']}"


class PromptedToolCallAgent(ToolCallAgent):
  """Tools described in the system prompt in `tool_format`; calls in `<tool_call>` blocks.

  Args:
    tool_format: a key of `TOOL_FORMATS`.
    example_messages: a worked example conversation (chat messages: user question, assistant
      call, user tool response, assistant answer) put between the system prompt and the question;
      small models follow a shown call much more often (measured).
    (the rest as `Agent`)
  """

  observation_role = "user"

  def __init__(
    self,
    tokenizer: Any,
    tools: Sequence[Tool | Callable] = (),
    reward_fn: Reward | Callable | None = None,
    system_prompt: str | None = None,
    template_kwargs: dict | None = None,
    env_provider: Any = None,
    task_env: str | None = None,
    tool_format: str = "hermes",
    example_messages: Sequence[dict] = (),
  ):
    if tool_format not in TOOL_FORMATS:
      raise ValueError(f"PromptedToolCallAgent: unknown tool_format {tool_format!r}; known: {sorted(TOOL_FORMATS)}")
    self.tool_format = tool_format
    for i, m in enumerate(example_messages):
      if not (isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)):
        raise ValueError(
          f"PromptedToolCallAgent: example_messages[{i}] must be a user/assistant chat "
          f"message with string content, got {m!r:.120}"
        )
    self.example_messages = [dict(m) for m in example_messages]
    super().__init__(
      tokenizer,
      tools=tools,
      reward_fn=reward_fn,
      system_prompt=system_prompt,
      template_kwargs=template_kwargs,
      env_provider=env_provider,
      task_env=task_env,
    )

  def template_tools(self, tools: list[Tool]) -> list[dict] | None:
    return None

  def system_text(self, tools: list[Tool]) -> str | None:
    schemas = [_function_schema(t) for t in tools]
    if self.tool_format == "hermes":
      listing = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    elif self.tool_format == "brief":
      listing = "\n".join(_signature(s) for s in schemas)
    else:
      listing = json.dumps(schemas, ensure_ascii=False)
    instructions = TOOL_FORMATS[self.tool_format].format(tools=listing)
    return f"{self.system_prompt}\n\n{instructions}" if self.system_prompt else instructions

  def initial_messages(
    self, row: dict, tools: list[Tool], first_observation: str | list[dict] | None = None
  ) -> list[dict]:
    messages = super().initial_messages(row, tools, first_observation)
    at = 1 if messages and messages[0]["role"] == "system" else 0
    return messages[:at] + [dict(m) for m in self.example_messages] + messages[at:]

  def assistant_message(self, text: str, parsed: ParsedTurn) -> dict:
    return {"role": "assistant", "content": text}

  def observation_messages(self, results: list[tuple[ToolCall, ToolOutput]], errors: list[str]) -> list[dict]:
    parts = [framed("<tool_response>\n", observation_content(out), "\n</tool_response>") for _, out in results]
    parts += [f"<tool_response>\nError: {e}\n</tool_response>" for e in errors]
    return [{"role": "user", "content": join_content(parts, "\n")}] if parts else []
