"""The colour of the shapes in a picture: the `visual_qa` env's `name_color` questions alone (4-8 shapes of one
colour; six answers), a visual task a small random-init vision tower learns on CPU.

  --config=configs/visual_qa_colors_sft_grpo.py     # SFT warm start on the answer format, then GRPO

Tools, reward, agent and env as tasks/visual_qa.py. The demonstration policy (`scripted_response`) calls the
answer tool with the picture's colour (the row's answer: the demonstrator reads the row, the agent never does) in
a share `sft.tool_use_prob` of the demos, and with a guess left out of the loss in the rest: a short warm start
learns the call and a little of the colours, and RL the rest from the images.
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


def scripted_response(prompt_text: str, use_tool: bool, rng: np.random.Generator, row: dict | None = None) -> list:
  """The answer tool called with a colour. In a share `use_tool` of the demos (config.sft.tool_use_prob) the
  picture's colour: the row's answer, which the demonstrator reads (rl/sft.takes_row) and the agent never sees;
  in the rest a colour drawn at random, left out of the loss (the warm start learns the call, not a guess)."""
  if use_tool and row is not None:
    return [(tool_call_text("answer", answer=row["answer"]), True)]
  guess = COLORS[int(rng.integers(len(COLORS)))]
  head, tail = tool_call_text("answer", answer=guess).split(f'"{guess}"')
  return [(head + '"', True), (guess, False), ('"' + tail, True)]


def tokenizer_corpus() -> list[str]:
  rows = make_rows(32, 0)
  return (
    visual_qa.tokenizer_corpus()
    + [r["question"] for r in rows[:4]]
    + [tool_call_text("answer", answer=c) for c in COLORS]
  )
