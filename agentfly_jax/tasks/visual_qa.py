"""Questions about a picture: the `visual_qa` env type on the env servers (envservers/envs/visual_qa.py).

  --config=configs/visual_qa_grpo.py        # a Qwen2.5-VL policy (model.family=qwen2_5_vl or a pretrained one)

Rows: the env's own (`make_rows(n, seed, split)`: train / dev / test scenes disjoint): {"id", "question",
"answer", "solution"}; the answer and the scene are reward-only fields. The env's reset (the question
and the image) opens the chat; the one tool `answer` sends the answer, which ends the episode. Reward:
the env's `exact_match` (1.0 for the right answer, case, spaces and a final full stop ignored). The
agent reads images (`agent.vision`: the image processor of a Qwen2.5-VL model).
"""

from __future__ import annotations

from agentfly_jax.envs.base import StepResult
from agentfly_jax.rewards import reward
from agentfly_jax.tasks.worlds import tool_call_text, world_agent
from agentfly_jax.tools import tool
from envservers.api import visual_qa_rows

ENV = "visual_qa"
SYSTEM_PROMPT = "You see a picture and a question about it. Reply with the answer tool: one word or number."


@tool(name="answer", env=ENV)
async def answer(answer: str, env) -> StepResult:
  """Answers the question about the picture (this ends the episode).

  Args:
    answer: the answer, one word or a number.
  """
  return await env.step(answer)


@reward(name="visual_qa_exact_match", env=ENV)
async def exact_match(env) -> dict:
  """1.0 when the episode's answer equals the row's (the env's exact_match), else 0.0."""
  return await env.compute_reward("exact_match")


TOOLS = (answer,)
REWARD = exact_match


def make_rows(n: int, seed: int) -> list[dict]:
  return visual_qa_rows.make_rows(n, seed, "train")


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """Dev rows (the evals during training)."""
  return visual_qa_rows.make_rows(n, seed, "dev")


def make_test_rows(n: int, seed: int) -> list[dict]:
  """Rows of the locked test split (a final evaluation only)."""
  return visual_qa_rows.make_rows(n, seed, "test")


def make_agent(tokenizer, system_prompt: str = SYSTEM_PROMPT, processor=None):
  """The world agent with images on: `processor` a VisionProcessor (default: Qwen2.5-VL's image processor)."""
  from agentfly_jax.vision.processor import VisionProcessor

  agent = world_agent(tokenizer, TOOLS, REWARD, system_prompt, ENV)
  agent.vision = processor if processor is not None else VisionProcessor()
  return agent


def tokenizer_corpus() -> list[str]:
  rows = visual_qa_rows.make_rows(32, 0, "train")
  texts = [SYSTEM_PROMPT] * 5 + [r["question"] for r in rows]
  return texts + [tool_call_text("answer", answer=r["answer"]) for r in rows]
