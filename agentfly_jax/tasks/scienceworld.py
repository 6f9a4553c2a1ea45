"""ScienceWorld: elementary-science tasks in a text simulator (30 task types, many variations).

Rows: {"question", "task_name", "variation", "simplification", "split"}, over all tasks with
ScienceWorld's own train/dev/test variation split (`experiments/make_world_tasks.py` writes
them from the simulator; `make_rows` uses the split recorded in SPLIT_SIZES-free form: the
variation lists come from a running JVM, so the trainer's rows come from `rows_file` if given).
Tools: `act` (one command) and `valid_actions`; reward: score / 100 (1.0 = solved).
"""
from __future__ import annotations

import json
import os

import numpy as np

from agentfly_jax.rewards import reward
from agentfly_jax.tasks.worlds import tool_call_text, world_agent
from agentfly_jax.tools import tool

ENV = "scienceworld"
SYSTEM_PROMPT = ("You do a science task in a text world. Send one command at a time with the act "
                 "tool (e.g. look around, go to kitchen, focus on water); valid_actions lists "
                 "possible commands.")
# Tasks whose variation 0..k are in ScienceWorld's train split (its split puts the first
# variations in train); used when no rows file is given.
DEFAULT_TASKS = ("find-living-thing", "find-non-living-thing", "find-plant", "find-animal")


@tool(name="act", env=ENV)
async def act(command: str, env) -> str:
  """Sends one command to the simulator.

  Args:
    command: e.g. "look around", "open door to kitchen", "focus on water".
  """
  return (await env.step(command)).observation


@tool(name="valid_actions", env=ENV)
async def valid_actions(env) -> str:
  """Lists the valid commands now (action x object combinations)."""
  return (await env.step({"query": "valid_actions"})).observation


@reward(name="scienceworld_score", env=ENV)
async def score_reward(env) -> dict:
  """Score / 100 of the episode (1.0 = solved), with `solved`."""
  return await env.compute_reward("score")


TOOLS = (act, valid_actions)
REWARD = score_reward


def rows_from_splits(splits: dict[str, dict[str, list[int]]], split: str,
                     simplification: str = "easy") -> list[dict]:
  """Rows of one split from {task_name: {split: [variation, ...]}} (see make_world_tasks.py)."""
  rows = []
  for task, by_split in sorted(splits.items()):
    for variation in by_split.get(split, []):
      rows.append({"question": f"Complete the ScienceWorld task {task}.", "task_name": task,
                   "variation": int(variation), "simplification": simplification, "split": split})
  return rows


def _rows(n: int, seed: int, split: str) -> list[dict]:
  path = os.environ.get("AGENTFLY_SCIENCEWORLD_ROWS", "")
  if path:
    with open(path) as f:
      rows = [r for r in json.load(f) if r.get("split") == split]
  else:   # variation 0-3 of the find-* tasks are train variations; test uses later ones
    variations = range(4) if split == "train" else range(150, 152)
    rows = rows_from_splits({t: {split: list(variations)} for t in DEFAULT_TASKS}, split)
  if not rows:
    raise ValueError(f"scienceworld: no {split!r} rows (rows file {path!r})")
  rng = np.random.default_rng([seed, 2718])
  return [dict(rows[int(i)]) for i in rng.integers(len(rows), size=n)]


def make_rows(n: int, seed: int) -> list[dict]:
  """n training rows: from $AGENTFLY_SCIENCEWORLD_ROWS (written by make_world_tasks.py) if set,
  else the find-* tasks' first train variations."""
  return _rows(n, seed, "train")


def make_eval_rows(n: int, seed: int) -> list[dict]:
  return _rows(n, seed, "test")


def make_agent(tokenizer):
  return world_agent(tokenizer, TOOLS, REWARD, SYSTEM_PROMPT, ENV)


def tokenizer_corpus(n: int = 50, seed: int = 0) -> list[str]:
  texts = [SYSTEM_PROMPT] * 10
  for command in ("look around", "go to kitchen", "go to outside", "open door to kitchen",
                  "focus on", "pick up", "move to", "inventory", "wait", "activate stove"):
    texts += [tool_call_text("act", command=command)] * 3
  texts += [r["question"] for r in make_rows(n, seed)]
  return texts
