"""Harbor-format tasks (Terminal-Bench 2.0 task directories: instruction.md, task.toml,
environment/, tests/test.sh) on the `swe` env, with the swe task's tools.

Rows: {"question", "harbor_task": "/abs/task-dir"} (`--config.task.train_path=rows.jsonl`), by
default the example tasks shipped in envservers/data/harbor_tasks. The task's environment/ files
are the repository at /repo; instruction.md opens the chat; reward: tests/test.sh run in a
grading sandbox (/logs/verifier/reward.txt, else its exit code). `check_rows` loads every task
before training and names a directory without tests/test.sh, or a task that needs its own
container image (and the field), which the bubblewrap sandbox does not run.
"""

from __future__ import annotations

from agentfly_jax.data import row_fields
from agentfly_jax.tasks.swe import REWARD, TOOLS  # the swe task's tools and reward
from agentfly_jax.tasks.worlds import tool_call_text, world_agent
from envservers.api import harbor_tasks

ENV = "swe"
# the task directory holds its tests/ and solution/: the env reads it, the agent gets instruction.md as the env's
# first observation
REWARD_ONLY_FIELDS = (*row_fields.REWARD_ONLY_FIELDS, "harbor_task")
QUESTION = "Do the task below in the repository, then submit."
SYSTEM_PROMPT = (
  "You work in a repository at /repo. Tools: bash(command) runs a shell command in /repo; "
  "view(path, lines) shows numbered lines of a file; str_replace(path, old, new) replaces the "
  "exact text old, which must occur once, with new; submit() ends the episode and runs the "
  "task's tests."
)


def _rows(dirs: list[str], split: str) -> list[dict]:
  return [{"question": QUESTION, "harbor_task": d, "split": split} for d in dirs]


def make_rows(n: int, seed: int) -> list[dict]:
  """n rows cycling over the shipped example tasks."""
  del seed
  dirs = harbor_tasks.shipped_task_dirs()
  return _rows([dirs[i % len(dirs)] for i in range(n)], "train")


def make_eval_rows(n: int, seed: int) -> list[dict]:
  del seed
  return _rows(harbor_tasks.shipped_task_dirs()[:n], "test")


def check_rows(rows: list[dict], source: str) -> list[dict]:
  """Every row's task loaded here; ValueError naming the row, the task and the field."""
  for i, row in enumerate(rows):
    if "harbor_task" not in row:
      raise ValueError(
        f"{source} row {i}: field 'harbor_task' (an absolute path to a Harbor task directory) is missing"
      )
    harbor_tasks.load_task(row["harbor_task"], f"{source} row {i}")
  return [{**r, "question": r.get("question") or QUESTION} for r in rows]


def make_agent(tokenizer, system_prompt: str = SYSTEM_PROMPT):
  return world_agent(tokenizer, TOOLS, REWARD, system_prompt, ENV)


def tokenizer_corpus() -> list[str]:
  texts = [SYSTEM_PROMPT, QUESTION] * 5
  for d in harbor_tasks.shipped_task_dirs():
    texts.append(harbor_tasks.load_task(d).problem_statement)
  texts += [tool_call_text("bash", command=c) for c in ("ls", "cat README.md", "python -m pytest -q")]
  texts += [tool_call_text("submit")] * 3
  return texts
