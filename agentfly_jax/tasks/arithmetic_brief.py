"""Arithmetic with a calculator, brief prompt: the questions, tool, reward and demos of
tasks/arithmetic.py, with the tool listed in one line (PromptedToolCallAgent format "brief", the
hermes call syntax) and no worked example: a ~90-token prompt instead of ~330. For a model that
SFT teaches the call format (configs/smollm2_arithmetic_sft_grpo.py), where the prompt's length
sets the cost of every training step on a CPU.
"""

from __future__ import annotations

from agentfly_jax.tasks import arithmetic
from agentfly_jax.tasks.arithmetic import (
  REWARD,
  SYSTEM_PROMPT,
  TOOLS,
  make_eval_rows,
  make_rows,  # noqa: F401
  make_test_rows,  # noqa: F401
  scripted_response,
  tokenizer_corpus,
)

TOOL_FORMAT = "brief"
FEWSHOT = False


def make_agent(tokenizer):
  return arithmetic.make_agent(tokenizer, tool_format=TOOL_FORMAT, fewshot=FEWSHOT)
