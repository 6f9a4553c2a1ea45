"""The three agents: `ToolCallAgent` (Qwen/Hermes `<tool_call>` JSON), `ReactAgent`
(Thought/Action/Action Input text) and `CodeAgent` (```python blocks -> the code tool).

  agent = ToolCallAgent("/path/to/tokenizer", tools=[calculator, answer], reward_fn=exact_match,
                        system_prompt="Answer with the answer tool.")
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from agentfly_jax.agents.base import Agent, observation_content
from agentfly_jax.vision.content import framed, join_content
from agentfly_jax.agents.parsers import ParsedTurn, ToolCall, parse_code_blocks, parse_hermes_tool_calls, parse_react
from agentfly_jax.rewards.reward import Reward
from agentfly_jax.tools.tool import Tool, ToolOutput


class ToolCallAgent(Agent):
  """Tools go to the chat template (the template lists them in the system prompt); the model
  answers with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, several per
  turn allowed, run concurrently; results come back as `tool` messages."""

  def parse(self, text: str) -> ParsedTurn:
    return parse_hermes_tool_calls(text)

  def assistant_message(self, text: str, parsed: ParsedTurn) -> dict:
    if not parsed.tool_calls:
      return {"role": "assistant", "content": text}
    return {
      "role": "assistant",
      "content": parsed.content,
      "tool_calls": [c.as_message_call() for c in parsed.tool_calls],
    }


REACT_INSTRUCTIONS = """You can use the following tools:

{tool_list}

Use exactly this format:

Thought: think about what to do next
Action: the tool to use, one of [{tool_names}]
Action Input: the tool's arguments as a JSON object

You will then receive "Observation: <the tool's output>". Repeat Thought/Action/Action Input as
needed. When you know the answer, write:

Thought: I know the final answer
Final Answer: the final answer"""


def _describe_tool(t: Tool) -> str:
  return f"- {t.name}: {t.description} Arguments: {json.dumps(t.parameters, ensure_ascii=False)}"


class ReactAgent(Agent):
  """Tools are described in the system prompt; the model writes `Action:` / `Action Input:` (one
  action per turn) or `Final Answer:`; observations come back as user messages
  `Observation: ...`."""

  observation_role = "user"

  def template_tools(self, tools: list[Tool]) -> list[dict] | None:
    return None

  def system_text(self, tools: list[Tool]) -> str | None:
    instructions = REACT_INSTRUCTIONS.format(
      tool_list="\n".join(_describe_tool(t) for t in tools) or "(none)", tool_names=", ".join(t.name for t in tools)
    )
    return f"{self.system_prompt}\n\n{instructions}" if self.system_prompt else instructions

  def parse(self, text: str) -> ParsedTurn:
    return parse_react(text)

  def observation_messages(self, results: list[tuple[ToolCall, ToolOutput]], errors: list[str]) -> list[dict]:
    lines = [framed("Observation: ", observation_content(out)) for _, out in results]
    lines += [f"Observation: Error: {e}" for e in errors]
    return [{"role": "user", "content": join_content(lines, "\n")}] if lines else []


CODE_INSTRUCTIONS = """Solve the task by writing Python code in a ```python code block; it runs
in a persistent Python session and you will see what it prints. Print the values you need.
When you know the answer, write "Final Answer: <the answer>" without a code block."""


class CodeAgent(Agent):
  """The model writes ```python blocks; all blocks of a turn run as one call of the code tool
  (default the built-in `code_interpreter`); output comes back as a user message
  `Observation:\\n...`. `Final Answer:` without code ends the chain."""

  observation_role = "user"

  def __init__(
    self,
    tokenizer: Any,
    tools: Sequence[Tool | Callable] | None = None,
    reward_fn: Reward | Callable | None = None,
    system_prompt: str | None = None,
    template_kwargs: dict | None = None,
    code_tool: str | None = None,
    env_provider: Any = None,
    task_env: str | None = None,
  ):
    if tools is None:
      from agentfly_jax.tools.builtin import code_interpreter

      tools = [code_interpreter]
    tools = list(tools)
    if not tools:
      raise ValueError("CodeAgent needs a code tool (default: code_interpreter)")
    names = [getattr(t, "name", getattr(t, "__name__", "")) for t in tools]
    self.code_tool_name = code_tool or names[0]
    if self.code_tool_name not in names:
      raise ValueError(f"CodeAgent: code_tool {self.code_tool_name!r} is not among the tools {names}")
    super().__init__(
      tokenizer,
      tools=tools,
      reward_fn=reward_fn,
      system_prompt=system_prompt,
      template_kwargs=template_kwargs,
      env_provider=env_provider,
      task_env=task_env,
    )
    params = list(self.tools[self.code_tool_name].parameters["properties"])
    if len(params) != 1:
      raise ValueError(
        f"CodeAgent: the code tool {self.code_tool_name!r} must take exactly one argument (the code), it takes {params}"
      )
    self.code_argument = params[0]

  def template_tools(self, tools: list[Tool]) -> list[dict] | None:
    return None

  def system_text(self, tools: list[Tool]) -> str | None:
    return f"{self.system_prompt}\n\n{CODE_INSTRUCTIONS}" if self.system_prompt else CODE_INSTRUCTIONS

  def parse(self, text: str) -> ParsedTurn:
    return parse_code_blocks(text, tool_name=self.code_tool_name, argument=getattr(self, "code_argument", "code"))

  def observation_messages(self, results: list[tuple[ToolCall, ToolOutput]], errors: list[str]) -> list[dict]:
    parts = [framed("Observation:\n", observation_content(out)) for _, out in results]
    parts += [f"Observation:\nError: {e}" for e in errors]
    return [{"role": "user", "content": join_content(parts, "\n")}] if parts else []
