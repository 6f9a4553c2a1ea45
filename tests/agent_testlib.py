"""Shared helpers for the tools/agents/rollout tests: tiny tokenizer folders (built once per
process) and scripted replies written as text."""

from __future__ import annotations

import functools
import os
import tempfile

from agentfly_jax.agents import load_tokenizer
from agentfly_jax.data import build_tiny_tokenizer

CORPUS = [
  "What is 2 + 3? The answer is 5.",
  "Compute (7 * 6) - 2 with the calculator.",
  "The weather in Oslo is sunny.",
  "Thought: I need the calculator.",
  "def f(x):\n    return x * 2\nprint(f(21))",
  "Hello world! Grüße, 你好 <b>&amp;</b>",
] * 4


@functools.lru_cache(maxsize=None)
def tokenizer_dir(template: str = "qwen2.5") -> str:
  """A tiny HF tokenizer folder for `template` ("qwen2.5" or "llama3"), built once."""
  out = os.path.join(tempfile.mkdtemp(prefix=f"agentfly_tok_{template}_"), "tok")
  return build_tiny_tokenizer(out, CORPUS, vocab_size=600, template=template)


@functools.lru_cache(maxsize=None)
def agent_tokenizer(template: str = "qwen2.5"):
  return load_tokenizer(tokenizer_dir(template))


def hermes_call(name: str, arguments: dict) -> str:
  import json

  return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
