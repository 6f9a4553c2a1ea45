"""The colour of the shapes in a picture: the `visual_qa` env's `name_color` questions alone (1-3 shapes of one
colour; six answers), a visual task a small random-init vision tower learns on CPU.

  --config=configs/visual_qa_colors_sft_grpo.py     # SFT warm start on the answer format, then GRPO

Tools, reward, agent and env as tasks/visual_qa.py. The demonstration policy (`scripted_response`) calls the
answer tool with a colour drawn at random, not the picture's: the warm start learns the call and the answer
words, and which colour the picture shows is left to RL (a demo cannot see the picture; the answer is a
reward-only field).
"""

from __future__ import annotations

import numpy as np

from agentfly_jax.tasks import visual_qa
from agentfly_jax.tasks.visual_qa import ENV, REWARD, SYSTEM_PROMPT, TOOLS, make_agent  # noqa: F401
from agentfly_jax.tasks.worlds import tool_call_text
from envservers.api import visual_qa_rows

KINDS = ("name_color",)
COLORS = tuple(visual_qa_rows.COLORS)


def make_rows(n: int, seed: int) -> list[dict]:
  return visual_qa_rows.make_rows(n, seed, "train", KINDS)


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """Dev rows (the evals during training)."""
  return visual_qa_rows.make_rows(n, seed, "dev", KINDS)


def make_test_rows(n: int, seed: int) -> list[dict]:
  """Rows of the locked test split (a final evaluation only)."""
  return visual_qa_rows.make_rows(n, seed, "test", KINDS)


def scripted_response(prompt_text: str, use_tool: bool, rng: np.random.Generator) -> str:
  """The answer tool called with a colour drawn uniformly (the demo does not see the picture)."""
  return tool_call_text("answer", answer=COLORS[int(rng.integers(len(COLORS)))])


def tokenizer_corpus() -> list[str]:
  rows = make_rows(32, 0)
  return (
    visual_qa.tokenizer_corpus()
    + [r["question"] for r in rows[:4]]
    + [tool_call_text("answer", answer=c) for c in COLORS]
  )
