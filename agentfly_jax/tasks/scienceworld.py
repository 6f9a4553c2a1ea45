"""ScienceWorld: elementary-science tasks in a text simulator (30 task types, many variations).

Rows: {"question", "task_name", "variation", "simplification", "split"} over all 30 tasks, with
ScienceWorld's own train/dev/test variation split (data/scienceworld_splits.json, read from
scienceworld 1.2.3 by `experiments/make_world_tasks.py --world=scienceworld`, which also writes
the rows). Tools: `act` (one command) and `valid_actions`; reward: score / 100 (1.0 = solved).
"""

from __future__ import annotations

import json
import os

import numpy as np

from agentfly_jax.envs.base import StepResult
from agentfly_jax.rewards import reward
from agentfly_jax.tasks.worlds import tool_call_text, world_agent
from agentfly_jax.tools import tool

ENV = "scienceworld"
SYSTEM_PROMPT = (
  "You do a science task in a text world. Send one command at a time with the act "
  "tool (e.g. look around, go to kitchen, focus on water); valid_actions lists "
  "possible commands."
)
SPLITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "scienceworld_splits.json")
SIMPLIFICATION = "easy"  # ScienceWorld's common simplification set for agents


@tool(name="act", env=ENV)
async def act(command: str, env) -> StepResult:
  """Sends one command to the simulator.

  Args:
    command: e.g. "look around", "open door to kitchen", "focus on water".
  """
  return await env.step(command)  # a StepResult: its `done` (the game over) ends the chain


@tool(name="valid_actions", env=ENV)
async def valid_actions(env) -> str:
  """Lists the valid commands now (action x object combinations)."""
  return (await env.step({"query": "valid_actions"})).observation


@reward(name="scienceworld_score", env=ENV)
async def score_reward(env) -> dict:
  """Score / 100 of the episode (1.0 = solved), with `solved`."""
  return await env.compute_reward("score")


TOOLS = (act, valid_actions)
# Typical simulator text, so that a tiny tokenizer trained for a random-init policy covers it.
SAMPLE_OBSERVATIONS = (
  "Task: Your task is to find a(n) animal. First, focus on the thing. Then, move it to the red box in the kitchen.",
  "This room is called the hallway. In it, you see: the agent, a substance called air, a "
  "picture. You also see: A door to the art studio (that is closed), A door to the bedroom "
  "(that is closed), A door to the greenhouse (that is open), A door to the kitchen (that is "
  "closed), A door to the living room (that is open), A door to the workshop (that is closed)",
  "This room is called the kitchen. In it, you see: a chair, a counter. On the counter is: a "
  "bowl (containing a red apple, a banana, an orange, a potato), a drawer. a cupboard (that is "
  "closed), a freezer (that is closed), a fridge (that is closed), a glass jar (containing a "
  "substance called sodium chloride), a lighter, an oven, which is turned off, a sink, a stove, "
  "a thermometer, currently reading a temperature of 10 degrees celsius",
  "No known action matches that input. You move to the kitchen. The door is now open. You "
  "focus on the water. You teleport to the outside. Completed.",
)
REWARD = score_reward


def rows_from_splits(splits: dict[str, dict[str, list[int]]], split: str, simplification: str = "easy") -> list[dict]:
  """Rows of one split from {task_name: {split: [variation, ...]}} (see make_world_tasks.py)."""
  rows = []
  for task, by_split in sorted(splits.items()):
    for variation in by_split.get(split, []):
      rows.append(
        {
          "question": f"Complete the ScienceWorld task {task}.",
          "task_name": task,
          "variation": int(variation),
          "simplification": simplification,
          "split": split,
        }
      )
  return rows


def splits() -> dict[str, dict[str, list[int]]]:
  """{task_name: {"train" | "dev" | "test": [variation, ...]}} (ScienceWorld's own split)."""
  with open(SPLITS_FILE) as f:
    return json.load(f)


def make_split_rows(n: int, seed: int, split: str, tasks=None) -> list[dict]:
  """n rows drawn (seeded) from one split, over all tasks or only `tasks`."""
  table = splits()
  if tasks is not None:
    unknown = sorted(set(tasks) - set(table))
    if unknown:
      raise ValueError(f"scienceworld: unknown tasks {unknown}; known: {sorted(table)}")
    table = {t: table[t] for t in tasks}
  rows = rows_from_splits(table, split, SIMPLIFICATION)
  rng = np.random.default_rng([seed, 2718])
  return [dict(rows[int(i)]) for i in rng.integers(len(rows), size=n)]


def make_rows(n: int, seed: int) -> list[dict]:
  """n training rows over all tasks' train variations."""
  return make_split_rows(n, seed, "train")


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """n held-out rows from the test variations."""
  return make_split_rows(n, seed, "test")


def make_agent(tokenizer):
  return world_agent(tokenizer, TOOLS, REWARD, SYSTEM_PROMPT, ENV)


def tokenizer_corpus(n: int = 50, seed: int = 0) -> list[str]:
  texts = [SYSTEM_PROMPT] * 10
  for command in (
    "look around",
    "go to kitchen",
    "go to outside",
    "open door to kitchen",
    "focus on",
    "pick up",
    "move to",
    "inventory",
    "wait",
    "activate stove",
  ):
    texts += [tool_call_text("act", command=command)] * 3
  texts += [r["question"] for r in make_rows(n, seed)]
  texts += list(SAMPLE_OBSERVATIONS) * 5
  return texts
