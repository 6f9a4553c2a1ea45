"""Built-in tasks (dataset generator + tools + reward + demonstration policy), by name."""
from __future__ import annotations

import importlib

_TASKS = {"lookup": "agentfly_jax.tasks.lookup", "multihop_qa": "agentfly_jax.tasks.multihop_qa",
          "math_calc": "agentfly_jax.tasks.math_calc", "code": "agentfly_jax.tasks.code_tasks",
          "webshop": "agentfly_jax.tasks.webshop", "textworld": "agentfly_jax.tasks.textworld",
          "scienceworld": "agentfly_jax.tasks.scienceworld", "arithmetic": "agentfly_jax.tasks.arithmetic",
          "arithmetic_brief": "agentfly_jax.tasks.arithmetic_brief", "swe": "agentfly_jax.tasks.swe",
          "multihop_qa_brief": "agentfly_jax.tasks.multihop_qa_brief",
          "webshop_brief": "agentfly_jax.tasks.webshop_brief"}


def get_task(name: str):
  """The task module registered under `name` (it defines make_rows, tools, a reward, ...)."""
  if name not in _TASKS:
    raise ValueError(f"unknown task {name!r}; known tasks: {sorted(_TASKS)}")
  return importlib.import_module(_TASKS[name])


__all__ = ["get_task"]


import dataclasses  # noqa: E402
from typing import Any, Callable, Sequence  # noqa: E402

import numpy as np  # noqa: E402


@dataclasses.dataclass
class Task:
  """A user-defined task for the Trainer: `Trainer(config, workdir, task=Task(...))`.

  Attributes:
    tools: `@tool` functions the agent may call.
    reward: the `@reward` function.
    rows: training rows (dicts with 'question' + fields the reward reads by name).
    eval_rows: held-out rows (default: the first 32 training rows).
    system_prompt: the agent's system prompt.
    corpus: extra texts for the tiny tokenizer when the model is random-init.
    scripted_response: optional demonstration policy `(prompt_text, use_tool, rng) -> text` (or
      `[(text, learn), ...]` pieces; `learn=False` pieces stay out of the loss) for the SFT warm
      start (config.sft.steps > 0).
    agent_factory: optional `tokenizer -> Agent` (default: a ToolCallAgent).
    agent_fn: optional black-box agent `async def run(client, row) -> answer`: the trainer runs it
      against the OpenAI-compatible endpoint over its sampler (`client` is an
      `openai.AsyncOpenAI`; agents/endpoint_rollout.py) instead of the built-in agent loop; the
      agent (agent_factory / ToolCallAgent) then gives the chat template, the tool-call parser
      and the reward.
  """
  tools: Sequence[Any] = ()
  reward: Callable | None = None
  rows: Sequence[dict] = ()
  eval_rows: Sequence[dict] = ()
  system_prompt: str = ""
  corpus: Sequence[str] = ()
  scripted_response: Callable | None = None
  agent_factory: Callable | None = None
  agent_fn: Callable | None = None

  def __post_init__(self):
    if self.reward is None:
      raise ValueError("Task.reward is missing: give a @reward function (or a plain function)")
    if self.agent_fn is not None:
      check_agent_fn(self.agent_fn, "Task.agent_fn")
    if not self.rows:
      raise ValueError("Task.rows is empty: give at least one training row")
    for i, row in enumerate(self.rows):
      if not isinstance(row, dict) or not isinstance(row.get("question"), str):
        raise ValueError(f"Task.rows[{i}] needs a string 'question' field, got {row!r:.120}")

  @property
  def TOOLS(self):  # noqa: N802 — the task-module attribute names
    return tuple(self.tools)

  @property
  def REWARD(self):  # noqa: N802
    return self.reward

  @property
  def SYSTEM_PROMPT(self):  # noqa: N802
    return self.system_prompt

  def make_rows(self, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [dict(self.rows[int(i)]) for i in rng.integers(len(self.rows), size=n)]

  def make_eval_rows(self, n: int, seed: int) -> list[dict]:
    """Held-out rows: `eval_rows` when given, else the first n training rows."""
    del seed
    return [dict(r) for r in (self.eval_rows or self.rows)[:n]]

  def tokenizer_corpus(self) -> list[str]:
    texts = [self.system_prompt, *self.corpus]
    texts += [json_text(r) for r in self.rows[:2000]]
    texts += [getattr(t, "description", "") or "" for t in self.tools]
    return texts

  def make_agent(self, tokenizer):
    if self.agent_factory is not None:
      return self.agent_factory(tokenizer)
    from agentfly_jax.agents import ToolCallAgent
    return ToolCallAgent(tokenizer, tools=list(self.tools), reward_fn=self.reward,
                         system_prompt=self.system_prompt or None)


def check_agent_fn(fn: Any, where: str) -> None:
  """`fn` must be `async def run(client, row)`; ValueError naming `where` otherwise."""
  import inspect
  if not inspect.iscoroutinefunction(fn):
    raise ValueError(f"{where} must be an async function run(client, row) -> answer, got "
                     f"{type(fn).__name__} {fn!r:.80}")
  try:
    inspect.signature(fn).bind(None, {})
  except TypeError as e:
    raise ValueError(f"{where} {getattr(fn, '__name__', fn)!r} must take (client, row): {e}") from None


def json_text(row: dict) -> str:
  return " ".join(str(v) for v in row.values())
