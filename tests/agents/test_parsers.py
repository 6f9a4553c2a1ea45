"""Tool-call parsers: examples, and hypothesis properties (arbitrary text never raises; it gives
well-formed calls or error messages; well-formed calls round-trip)."""

import json
import re

from hypothesis import given, settings, strategies as st

from agentfly_jax.agents import parse_code_blocks, parse_hermes_tool_calls, parse_react
from agentfly_jax.agents.parsers import ParsedTurn

SNIPPETS = [
  "<tool_call>",
  "</tool_call>",
  '{"name": "calc", "arguments": {"x": 1}}',
  "{",
  "}",
  '"name"',
  "Action:",
  "Action Input:",
  "Observation:",
  "Final Answer:",
  "```python\n",
  "```",
  "\n",
  "[[[[[[",
  "null",
  '"arguments": "{}"',
  "Thought:",
  "print(1)",
]
model_text = st.lists(st.one_of(st.sampled_from(SNIPPETS), st.text(max_size=20)), max_size=12).map("".join)

json_values = st.recursive(
  st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=10),
  lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
  max_leaves=8,
)
arguments = st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=4)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)


def _well_formed(parsed):
  assert isinstance(parsed, ParsedTurn) and isinstance(parsed.content, str)
  for call in parsed.tool_calls:
    assert isinstance(call.name, str) and call.name
    assert isinstance(call.arguments, dict)
  assert all(isinstance(e, str) and e for e in parsed.errors)


@settings(max_examples=300, deadline=None)
@given(model_text)
def test_arbitrary_text_never_raises(text):
  for parse in (parse_hermes_tool_calls, parse_react, parse_code_blocks):
    _well_formed(parse(text))


@settings(max_examples=200, deadline=None)
@given(model_text)
def test_every_tool_call_block_gives_a_call_or_an_error(text):
  blocks = [m.group(1) for m in re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)]
  end = text.rfind("</tool_call>") + len("</tool_call>") if blocks else 0
  if "<tool_call>" in text[end:]:
    blocks.append(text[text.find("<tool_call>", end) + len("<tool_call>") :])

  def items(body):  # a block holding a JSON list gives one call or error per item
    try:
      obj = json.loads(body.strip())
    except (ValueError, RecursionError):
      return 1
    return len(obj) if isinstance(obj, list) else 1

  expected = sum(items(b) for b in blocks)
  parsed = parse_hermes_tool_calls(text)
  assert len(parsed.tool_calls) + len(parsed.errors) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(names, arguments), min_size=1, max_size=4), st.text(max_size=30))
def test_hermes_calls_round_trip(calls, prose):
  prose = prose.replace("<tool_call>", "").replace("</tool_call>", "")
  text = prose + "".join(f'\n<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>' for n, a in calls)
  parsed = parse_hermes_tool_calls(text)
  assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(n, a) for n, a in calls]
  assert parsed.errors == [] and parsed.content == prose.strip()


@settings(max_examples=100, deadline=None)
@given(names, arguments)
def test_react_round_trip(name, args):
  text = f"Thought: use it\nAction: {name}\nAction Input: {json.dumps(args)}\nObservation: fake"
  [call] = parse_react(text).tool_calls
  assert call.name == name and call.arguments == args and call.raw_arguments is None


def test_hermes_examples():
  parsed = parse_hermes_tool_calls(
    'I will call.\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>\n'
    '<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>'
    '<tool_call>{"name": "g", "parameters": {"b": 3}}</tool_call>'
    '<tool_call>not json</tool_call><tool_call>{"arguments": {}}</tool_call>'
    '<tool_call>{"name": "h", "arguments": [1]}</tool_call><tool_call>{"name": "open"'
  )
  assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("calc", {"x": 1}), ("f", {"a": 2}), ("g", {"b": 3})]
  assert len(parsed.errors) == 4
  assert "tool call #4 is not valid JSON" in parsed.errors[0]
  assert "missing a string field 'name'" in parsed.errors[1]
  assert "must be a JSON object" in parsed.errors[2]
  assert "tool call #7" in parsed.errors[3]
  assert parsed.content == "I will call."
  assert parse_hermes_tool_calls("just text").tool_calls == []
  # a block may hold a JSON list of calls (SmolLM2 / xLAM style); [] is no call, no error
  listed = parse_hermes_tool_calls(
    '<tool_call>[\n{"name": "calc", "arguments": {"x": 1}}, '
    '{"name": "f", "arguments": {}}, {"arguments": {}}\n]</tool_call>'
  )
  assert [(c.name, c.arguments) for c in listed.tool_calls] == [("calc", {"x": 1}), ("f", {})]
  assert listed.errors == ["tool call #1, item 3: missing a string field 'name'"]
  empty = parse_hermes_tool_calls("No call needed. <tool_call>[]</tool_call>")
  assert empty.tool_calls == [] and empty.errors == [] and empty.content == "No call needed."


def test_react_examples():
  p = parse_react("Thought: add\nAction: calculator\nAction Input: 2 + 3\nObservation: 5")
  assert p.tool_calls[0].name == "calculator" and p.tool_calls[0].raw_arguments == "2 + 3"
  p = parse_react("Thought: done\nFinal Answer: 5 apples")
  assert p.tool_calls == [] and p.final_answer == "5 apples"
  p = parse_react("Action:   \nAction Input: {}")
  assert p.errors and not p.tool_calls
  p = parse_react('Action: search\nAction Input: ```json\n{"q": "x"}\n```')
  assert p.tool_calls[0].arguments == {"q": "x"}


def test_code_block_examples():
  p = parse_code_blocks("First:\n```python\nx = 1\n```\nthen\n```py\nprint(x)\n```")
  assert p.tool_calls[0].name == "code_interpreter"
  assert p.tool_calls[0].arguments == {"code": "x = 1\nprint(x)"}
  p = parse_code_blocks("```python\nprint('unclosed')")
  assert p.tool_calls[0].arguments["code"] == "print('unclosed')"
  p = parse_code_blocks("No code. Final Answer: 7", tool_name="run", argument="src")
  assert p.tool_calls == [] and p.final_answer == "7"
