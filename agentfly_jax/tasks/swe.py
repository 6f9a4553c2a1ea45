"""Software engineering: fix the bug an issue describes in a small Python repository.

Rows: {"question", "task_id", "split"} naming a task of the shipped set (envservers/data/
swe_tasks: the train, dev and locked test splits use different repositories), or SWE-Gym-style
rows a user brings ({"repo", "problem_statement", "hidden_tests", "test_command"}; `check_rows` runs each in
the sandbox before training and names a bad row and its field). The env `swe` gives each chain a
fresh copy of the repository in a bubblewrap sandbox; its reset text (the issue) opens the chat.
Tools: bash, view, str_replace, submit (ends the chain); reward: the fraction of the task's
hidden tests that pass (graded in a second sandbox the agent never sees), with passed / total /
submitted as metrics.
"""

from __future__ import annotations

import numpy as np

from agentfly_jax.data import row_fields
from agentfly_jax.rewards import reward
from agentfly_jax.tasks.worlds import tool_call_text, world_agent
from agentfly_jax.tools import tool
from envservers.api import swe_policies, swe_rows, swe_tasks

ENV = "swe"
QUESTION = "Fix the bug the issue below describes, then submit."
SYSTEM_PROMPT = (
  "You fix bugs in a Python repository at /repo. Tools: bash(command) runs a shell command in "
  "/repo; view(path, lines) shows numbered lines of a file, e.g. lines=\"1-40\"; "
  "str_replace(path, old, new) replaces the exact text old, which must occur once, with new; "
  "submit() ends the episode and runs hidden tests. Run the tests, read the traceback, view "
  "the file it names, fix it with str_replace, run the tests again, then submit."
)


@tool(name="bash", env=ENV)
async def bash(command: str, env) -> str:
  """Runs a shell command in /repo (e.g. python -m pytest -q); returns its output.

  Args:
    command: the command line.
  """
  return (await env.step({"action": "bash", "command": command})).observation


@tool(name="view", env=ENV)
async def view(path: str, env, lines: str = "") -> str:
  """Shows a file with line numbers (or lists a folder).

  Args:
    path: a file under /repo, e.g. pkg/module.py.
    lines: "start-end" (1-based), empty for the whole file.
  """
  return (await env.step({"action": "view", "path": path, "lines": lines or None})).observation


@tool(name="str_replace", env=ENV)
async def str_replace(path: str, old: str, new: str, env) -> str:
  """Replaces the exact text `old` (it must occur once in the file) with `new`.

  Args:
    path: a file under /repo.
    old: the text to replace, copied exactly (indentation included).
    new: the replacement.
  """
  return (await env.step({"action": "str_replace", "path": path, "old": old, "new": new})).observation


@tool(name="submit", env=ENV, finish=True)
async def submit(env) -> str:
  """Submits the repository as it is: the hidden tests run and the episode ends."""
  return (await env.step({"action": "submit"})).observation


@reward(name="swe_hidden_tests", env=ENV)
async def hidden_tests_reward(env) -> dict:
  """The fraction of the task's hidden tests passing, with passed / total / submitted."""
  return await env.compute_reward("hidden_tests")


TOOLS = (bash, view, str_replace, submit)
REWARD = hidden_tests_reward
# the task id names the task's sealed files (its reference fix, its hidden tests): the env reads them by it, the
# agent gets the issue as the env's first observation
REWARD_ONLY_FIELDS = (*row_fields.REWARD_ONLY_FIELDS, "task_id")


def _rows(task_ids: list[str], split: str) -> list[dict]:
  return [{"question": QUESTION, "task_id": t, "split": split} for t in task_ids]


def make_rows(n: int, seed: int) -> list[dict]:
  """n training rows drawn (with replacement) from the shipped train split."""
  ids = swe_tasks.shipped_task_ids("train")
  rng = np.random.default_rng(seed)
  return _rows([ids[int(i)] for i in rng.integers(len(ids), size=n)], "train")


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """The shipped dev split (a repository of its own: the evals during training, for choosing
  recipes), each task once, up to n."""
  del seed
  return _rows(swe_tasks.shipped_task_ids("dev")[:n], "dev")


def make_test_rows(n: int, seed: int) -> list[dict]:
  """The locked test split (repositories of their own, read only by the final evaluation:
  experiments/learning_report.py), each task once, up to n."""
  del seed
  return _rows(swe_tasks.shipped_task_ids("test")[:n], "test")


def check_rows(rows: list[dict], source: str) -> list[dict]:
  """Rows a user brings: each checked in a local sandbox (fields, the test command runs on the
  unmodified repository, the hidden tests do not already pass); ValueError naming the row and
  field. Shipped `task_id` rows are checked by name only (the generator checked them)."""
  if all(isinstance(r, dict) and "task_id" in r and "repo" not in r for r in rows):
    for i, row in enumerate(rows):
      swe_tasks.resolve_row(row, f"{source} row {i}")
    return [{**r, "question": r.get("question") or QUESTION} for r in rows]
  return swe_rows.check_rows(list(rows), source)


def make_agent(tokenizer, system_prompt: str = SYSTEM_PROMPT):
  return world_agent(tokenizer, TOOLS, REWARD, system_prompt, ENV)


def expert_policy(row: dict, observation: str, expert: swe_policies.ScriptedExpert | None = None):
  """The scripted expert's next action for a shipped task (an `expert` carries its stage)."""
  expert = expert or swe_policies.ScriptedExpert(swe_tasks.shipped_task_meta(row["task_id"]))
  return expert.act(observation)


def tokenizer_corpus(n: int = 200, seed: int = 0) -> list[str]:
  """Texts a random-init model's tokenizer is trained on: the train split's only (the dev and test
  repositories' code and issues stay unseen, as with the other tasks' locked splits)."""
  del seed
  texts = [SYSTEM_PROMPT, QUESTION] * 5
  for task_id in swe_tasks.shipped_task_ids("train")[:n]:
    meta = swe_tasks.shipped_task_meta(task_id)
    fix = swe_tasks.reference_fix(meta)
    texts += [
      meta["problem_statement"],
      tool_call_text("bash", command=meta["test_command"]),
      tool_call_text("view", path=fix["path"], lines="1-40"),
      tool_call_text("str_replace", path=fix["path"], old=fix["old"], new=fix["new"]),
      tool_call_text("submit"),
    ]
  return texts
