"""Shared pieces of the interactive-world tasks (webshop, textworld, scienceworld).

Each world is an env type on the env servers; its task module gives rows (the world's task ids
plus a `question`), stateful tools bound to the chain's env, an env-bound reward, and an agent
whose first user message carries the world's opening observation (`task_env`).
"""

from __future__ import annotations

import json
import os


def world_agent(tokenizer, tools, reward_fn, system_prompt: str, env_name: str):
  """A ToolCallAgent for a world: the tools described in one line of the system prompt (short
  prompts for tiny CPU policies) and the env's reset text appended to the first user message."""
  from agentfly_jax.agents import ToolCallAgent

  class WorldAgent(ToolCallAgent):
    def template_tools(self, tools):
      return None

  return WorldAgent(tokenizer, tools=list(tools), reward_fn=reward_fn, system_prompt=system_prompt, task_env=env_name)


def seeded_rows(question: str, n: int, seed: int, *, split: str) -> list[dict]:
  """n rows of one question whose env seeds are seed*100000 + 0..n-1 (train) or 10**9 + that (any other
  split: disjoint from the training seeds); the env (gym id, OpenEnv server) comes from the task's config."""
  base = seed * 100000 + (0 if split == "train" else 10**9)
  return [{"question": question, "seed": base + i, "split": split} for i in range(n)]


def tool_call_text(tool_name: str, **arguments) -> str:
  """The model text that calls `tool_name` (the Qwen-style tool-call format)."""
  return f'<tool_call>\n{json.dumps({"name": tool_name, "arguments": arguments})}\n</tool_call>'


def write_rows(rows: list[dict], path: str) -> str:
  """Writes AgentFly JSON rows (a JSON list) to `path`; returns the path."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(rows, f, indent=1)
  return path
