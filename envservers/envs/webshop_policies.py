"""Scripted shop policies over the page text alone (no server state): the expert that follows a goal
and a uniformly random one. Shared by the env server's tests and the trainer-side task
(agentfly_jax/tasks/webshop.py), which must not import the server's env."""

from __future__ import annotations

import re

import numpy as np


def expert_actions(observation: str, goal: dict) -> str:
  """The goal path's next action given the current observation: search the goal's title, page
  to the goal product, pick the goal options, buy."""
  actions = re.search(r"Available actions: (.*)$", observation)
  available = [a.strip() for a in actions.group(1).split(", ")] if actions else []
  if "search[<your query>]" in available:
    return f"search[{goal['name']}]"
  asin = goal["asin"].lower()
  if f"click[{asin}]" in available:
    return f"click[{asin}]"
  if "click[buy now]" in available:
    selected = set(re.findall(r"\[([^\]]+)\] \(selected\)", observation))
    for value in goal["goal_options"].values():
      if value not in selected:
        return f"click[{value}]"
    return "click[buy now]"
  if "click[next >]" in available:
    return "click[next >]"
  return "click[back to search]"


def random_action(observation: str, rng: np.random.Generator, queries: list[str]) -> str:
  """A uniformly random valid action (searches draw a query from `queries`)."""
  actions = re.search(r"Available actions: (.*)$", observation)
  available = [a.strip() for a in actions.group(1).split(", ")] if actions else []
  if not available:
    return "click[buy now]"
  action = available[int(rng.integers(len(available)))]
  if action == "search[<your query>]":
    return f"search[{queries[int(rng.integers(len(queries)))]}]"
  return action
