"""PromptedToolCallAgent: the tool schema goes into the system prompt (for templates that ignore
`tools`), a worked example sits between it and the question, calls parse in both formats, and the
rollout's observation text renders as a user message."""

import json

import pytest

from agent_testlib import agent_tokenizer
from agentfly_jax.agents.prompted import PromptedToolCallAgent
from agentfly_jax.tasks import arithmetic


@pytest.mark.parametrize("fmt", ["hermes", "json_list"])
def test_schema_in_system_prompt_example_and_parse(fmt):
  agent = arithmetic.make_agent(agent_tokenizer(), tool_format=fmt, fewshot=True)
  row = arithmetic.make_rows(1, seed=3)[0]
  messages = agent.initial_messages(row, list(agent.tools.values()))
  assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
  assert messages[-1]["content"] == row["question"]
  schema = json.dumps(arithmetic.calculator.parameters, ensure_ascii=False)
  assert schema in messages[0]["content"] and '"name": "calculator"' in messages[0]["content"]
  assert agent.template_tools(list(agent.tools.values())) is None
  example_call = messages[2]["content"]
  [call] = agent.parse(example_call).tool_calls
  assert (call.name, call.arguments) == ("calculator", {"expression": "12 * 34"})
  # the model's raw text is the assistant content; tool output comes back as a user message
  assert agent.assistant_message(example_call, agent.parse(example_call)) == {
    "role": "assistant",
    "content": example_call,
  }
  from agentfly_jax.tools.tool import ToolOutput

  [obs] = agent.observation_messages([(call, ToolOutput("408"))], ["bad call"])
  assert obs == {
    "role": "user",
    "content": "<tool_response>\n408\n</tool_response>\n<tool_response>\nError: bad call\n</tool_response>",
  }


def test_bad_format_and_example_are_named():
  tok = agent_tokenizer()
  with pytest.raises(ValueError, match="unknown tool_format 'xml'"):
    PromptedToolCallAgent(tok, tools=list(arithmetic.TOOLS), tool_format="xml")
  with pytest.raises(ValueError, match=r"example_messages\[0\]"):
    PromptedToolCallAgent(tok, tools=list(arithmetic.TOOLS), example_messages=[{"role": "tool", "content": "x"}])


def test_brief_format_lists_signatures_and_demo_calls_parse():
  """The "brief" prompt (task arithmetic_brief): one line per tool with its argument names and
  types; the task's scripted demo call parses to the question's expression."""
  import numpy as np

  from agentfly_jax.tasks import get_task
  from agentfly_jax.tools import tool

  @tool
  def lookup(key: str, limit: int = 3) -> str:
    """Looks a key up."""
    return key

  agent = PromptedToolCallAgent(agent_tokenizer(), tools=[arithmetic.calculator, lookup], tool_format="brief")
  system = agent.system_text(list(agent.tools.values()))
  assert "calculator(expression: string): Evaluates" in system
  assert "lookup(key: string, limit: integer): Looks a key up." in system
  brief = get_task("arithmetic_brief")
  agent = brief.make_agent(agent_tokenizer())
  row = brief.make_rows(1, seed=5)[0]
  messages = agent.initial_messages(row, list(agent.tools.values()))
  assert [m["role"] for m in messages] == ["system", "user"]  # no worked example
  demo = brief.scripted_response(f"...{messages[-1]['content']}", True, np.random.default_rng(0))
  [call] = agent.parse(demo).tool_calls
  assert call.name == "calculator" and call.arguments == {"expression": row["expression"]}
