"""What of a row an agent sees: every field but the reward's own (the reward-only fields a task declares).

  seen = agent_view(row, ("answer", "tests"))     # the row without its reward-only fields

A row holds what the agent is asked (`question`, and any field a custom agent or harness reads) and what
only the reward, and the environment that grades the episode, may read: the answer, hidden tests, gold
actions. Every agent kind gets `agent_view(row, reward_only)`: the built-in agents' prompt and per-row tools
(agents/rollout.py), an `agent_fn`'s `row` argument and an outside harness's AGENTFLY_ROW / stdin
(agents/endpoint_rollout.py). The reward, the env's reset and the trajectory (`Trajectory.row`, trainer
side) keep the whole row. A task declares its reward-only fields (tasks/contract.py: a module's
`REWARD_ONLY_FIELDS`, `Task(reward_only_fields=...)`, `config.task.reward_only_fields`); a task that
declares none gets `REWARD_ONLY_FIELDS`.
"""

from __future__ import annotations

from typing import Iterable

# the names rewards read that an agent must never see (the built-in tasks' answers, hidden tests, gold
# actions, reference solutions), hidden in every task that does not declare its own set
REWARD_ONLY_FIELDS = ("answer", "tests", "hidden_tests", "fail_to_pass", "gold_actions", "solution")


def check_reward_only(fields: Iterable[str] | str, where: str) -> tuple[str, ...]:
  """The reward-only field names as a tuple (a string: comma-separated); ValueError naming `where` for a
  name that is not a non-empty string, or for `question` (the agent must be asked something)."""
  if isinstance(fields, str):
    fields = [f.strip() for f in fields.split(",") if f.strip()]
  out = tuple(fields)
  for name in out:
    if not isinstance(name, str) or not name:
      raise ValueError(f"{where}: reward-only field names must be non-empty strings, got {name!r}")
    if name == "question":
      raise ValueError(f"{where}: 'question' cannot be reward-only (it is what the agent is asked)")
  return out


def agent_view(row: dict, reward_only: Iterable[str]) -> dict:
  """`row` without its reward-only fields (a new dict; the row itself is left as it was)."""
  hidden = set(reward_only)
  return {k: v for k, v in row.items() if k not in hidden}
