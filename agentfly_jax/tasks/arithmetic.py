"""Arithmetic with a calculator: 'What is 487 * 36?' — numbers a small model cannot multiply in
its head, so the reliable way is to call `calculator(expression=...)` and state its result.

A real tool task for a real small model (SmolLM2-135M-Instruct, `configs/smollm2_*.py`): its chat
template ignores `tools`, so the agent writes the tool schema into the system prompt
(`PromptedToolCallAgent`, format `TOOL_FORMAT`, the best of the formats measured by
lab/bench/measure_tool_formats.py). Reward: `numeric_match` (the last number of the final
message equals the product).
"""

from __future__ import annotations

import hashlib

import numpy as np

from agentfly_jax.rewards.builtin import numeric_match
from agentfly_jax.tools.builtin import calculator

SYSTEM_PROMPT = "Use the calculator for arithmetic."
TOOL_FORMAT = "hermes"
FEWSHOT = True
TOOLS = (calculator,)
REWARD = numeric_match

OPS = ("*", "+", "-")

# A worked example shown before the question (`make_agent(..., fewshot=True)`), in the agent's format.
_EXAMPLE_CALLS = {
  "hermes": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>',
  "json_list": '<tool_call>[\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n]</tool_call>',
}


def example_messages(tool_format: str) -> list[dict]:
  return [
    {"role": "user", "content": "What is 12 * 34?"},
    {"role": "assistant", "content": _EXAMPLE_CALLS[tool_format]},
    {"role": "user", "content": "<tool_response>\n408\n</tool_response>"},
    {"role": "assistant", "content": "The answer is 408."},
  ]


def expression_split(expression: str) -> str:
  """The split of an expression, by a fixed hash: ~10 % test (locked), ~10 % dev, the rest train."""
  bucket = int(hashlib.sha256(f"agentfly-arithmetic-split:{expression}".encode()).hexdigest()[:8], 16) % 10
  return {0: "test", 1: "dev"}.get(bucket, "train")


def make_rows(n: int, seed: int, ops: tuple = ("*",), split: str = "train") -> list[dict]:
  """n rows {question, expression, answer} of `split`: `a op b` with a in [100, 999], b in [11, 99],
  drawn with `seed` and kept when the expression belongs to the split (no expression is in two)."""
  rng = np.random.default_rng(seed)
  rows = []
  while len(rows) < n:
    a, b = int(rng.integers(100, 1000)), int(rng.integers(11, 100))
    op = ops[int(rng.integers(len(ops)))]
    expression = f"{a} {op} {b}"
    if expression_split(expression) != split:
      continue
    rows.append(
      {"question": f"What is {expression}?", "expression": expression, "answer": str(calculator(expression=expression))}
    )
  return rows


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """Dev rows (the eval during training): expressions never in training."""
  return make_rows(n, seed=1_000_003 + seed, split="dev")


def make_test_rows(n: int, seed: int) -> list[dict]:
  """Rows of the locked test split (the final evaluation only): expressions in neither train nor dev."""
  return make_rows(n, seed=2_000_003 + seed, split="test")


def scripted_response(prompt_text: str, use_tool: bool, rng: np.random.Generator) -> str | list:
  """Demonstrations in the hermes format: call the calculator with the question's expression,
  then state the result (a guess without the tool is generated but not learned)."""
  import re

  obs = re.findall(r"<tool_response>\s*(-?\d+)\s*</tool_response>", prompt_text[prompt_text.rfind("What is") :])
  if obs:
    return f"The answer is {obs[-1]}."
  expression = re.findall(r"What is ([0-9 +*-]+)\?", prompt_text)
  if use_tool and expression:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression[-1]}"}}}}\n</tool_call>'
  return [("The answer is", True), (f" {int(rng.integers(1000, 100000))}", False), (".", True)]


def tokenizer_corpus(n: int = 200, seed: int = 7) -> list[str]:
  return [SYSTEM_PROMPT] + [r["question"] for r in make_rows(n, seed)]


def make_agent(tokenizer, tool_format: str = TOOL_FORMAT, fewshot: bool = FEWSHOT):
  from agentfly_jax.agents.prompted import PromptedToolCallAgent

  return PromptedToolCallAgent(
    tokenizer,
    tools=list(TOOLS),
    reward_fn=REWARD,
    system_prompt=SYSTEM_PROMPT,
    tool_format=tool_format,
    example_messages=example_messages(tool_format) if fewshot else (),
  )
