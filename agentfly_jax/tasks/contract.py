"""The task contract: what the trainer, evaluation and the SFT warm start need from a task.

    spec = task_spec(get_task("lookup"), name="lookup")   # a built-in task module
    spec = task_spec(Task(tools=..., reward=..., rows=...))  # a user Task
    spec.make_rows(8, seed=0); spec.make_agent(tokenizer); spec.env_types

Built-in tasks are modules of UPPERCASE globals (TOOLS, REWARD, SYSTEM_PROMPT, ROWS ...) and
functions (make_rows, make_eval_rows, make_agent, scripted_response, tokenizer_corpus, ...); user
task modules are written the same way, and a user may also give a `Task` object. Every one of them
is turned into a `TaskSpec` once, here: `read_task_module` is the one place that reads a module's
globals, `task_spec` the one adapter.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Sequence

import numpy as np

from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS, check_reward_only

EVAL_SEED_OFFSET = 999_983  # a module without eval rows: make_rows at this seed offset (disjoint rows)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A task, whatever it was written as.

  Attributes:
    name: the task's name (plots, logs).
    tools: the `Tool`s the agent may call.
    reward: the `Reward` (or plain function) scoring a chain.
    system_prompt: the agent's system prompt ("" = none).
    rows / eval_rows: fixed training / held-out rows (() when the task generates them).
    generate_rows / generate_eval_rows: `(n, seed) -> rows` generators (None: use the fixed rows).
      The eval rows are the dev split (read during training, for choosing recipes).
    generate_test_rows: `(n, seed) -> rows` of the locked test split (None: the task has none);
      read only by a final evaluation (experiments/learning_report.py), never during training.
    corpus: `() -> texts` for a random-init model's tiny tokenizer (None: the prompt,
      `extra_corpus`, the fixed rows and the tool descriptions).
    extra_corpus: more texts for that default corpus.
    scripted_response: the demonstration policy `(prompt_text, use_tool, rng) -> text | pieces` of
      the SFT warm start (None: the task has none).
    agent_factory: `tokenizer -> Agent` (None: a ToolCallAgent over the tools and reward).
    agent_fn: a black-box agent `async def run(client, row)` trained through the endpoint.
    reward_only_fields: the row fields only the reward (and the env grading the episode) reads: no agent
      kind ever receives them (data/row_fields.py; default `REWARD_ONLY_FIELDS`).
    source: what the spec was made from (a module or a `Task`).
  """

  name: str
  tools: tuple
  reward: Any
  system_prompt: str = ""
  rows: tuple = ()
  eval_rows: tuple = ()
  generate_rows: Callable[[int, int], list] | None = None
  generate_eval_rows: Callable[[int, int], list] | None = None
  generate_test_rows: Callable[[int, int], list] | None = None
  corpus: Callable[[], list] | None = None
  extra_corpus: tuple = ()
  scripted_response: Callable | None = None
  agent_factory: Callable | None = None
  agent_fn: Callable | None = None
  reward_only_fields: tuple[str, ...] = REWARD_ONLY_FIELDS
  source: Any = None

  def __post_init__(self):
    if self.reward is None:
      raise ValueError(f"task {self.name!r} has no reward")
    where = f"task {self.name!r} reward_only_fields"
    object.__setattr__(self, "reward_only_fields", check_reward_only(self.reward_only_fields, where))
    if self.generate_rows is None and not self.rows:
      raise ValueError(f"task {self.name!r} has neither rows nor a row generator (make_rows)")

  def make_rows(self, n: int, seed: int) -> list[dict]:
    """n training rows: generated, or drawn (with replacement) from the fixed rows."""
    if self.generate_rows is not None:
      return list(self.generate_rows(n, seed))
    rng = np.random.default_rng(seed)
    return [dict(self.rows[int(i)]) for i in rng.integers(len(self.rows), size=n)]

  def make_eval_rows(self, n: int, seed: int) -> list[dict]:
    """n held-out rows: generated; else the fixed eval rows (or the first training rows) of a
    task with fixed rows; else training rows at a disjoint seed."""
    if self.generate_eval_rows is not None:
      return list(self.generate_eval_rows(n, seed))
    if self.rows:
      return [dict(r) for r in (self.eval_rows or self.rows)[:n]]
    return self.make_rows(n, seed=EVAL_SEED_OFFSET + seed)

  def make_test_rows(self, n: int, seed: int) -> list[dict]:
    """n rows of the locked test split (for the final evaluation only)."""
    if self.generate_test_rows is None:
      raise ValueError(f"task {self.name!r} has no locked test split (make_test_rows)")
    return list(self.generate_test_rows(n, seed))

  def split_rows(self, split: str, n: int, seed: int) -> list[dict]:
    """n rows of `split`: "train" (make_rows), "dev" (make_eval_rows: the evals during training) or
    "test" (make_test_rows: the locked split, for a final evaluation only)."""
    make = {"train": self.make_rows, "dev": self.make_eval_rows, "test": self.make_test_rows}.get(split)
    if make is None:
      raise ValueError(f"split {split!r}: must be 'train', 'dev' or 'test'")
    return make(n, seed)

  def tokenizer_corpus(self) -> list[str]:
    if self.corpus is not None:
      return list(self.corpus())
    texts = [self.system_prompt, *self.extra_corpus]
    texts += [" ".join(str(v) for v in r.values()) for r in self.rows[:2000]]
    texts += [getattr(t, "description", "") or "" for t in self.tools]
    return texts

  def make_agent(self, tokenizer):
    if self.agent_factory is not None:
      return self.agent_factory(tokenizer)
    from agentfly_jax.agents import ToolCallAgent

    return ToolCallAgent(
      tokenizer, tools=list(self.tools), reward_fn=self.reward, system_prompt=self.system_prompt or None
    )

  @property
  def env_types(self) -> tuple[str, ...]:
    """The env-server types the task's tools and reward run in (e.g. ("webshop",))."""
    names = {getattr(t, "env_name", None) for t in (*self.tools, self.reward)}
    return tuple(sorted(n for n in names if n))


@dataclasses.dataclass(frozen=True)
class TaskModule:
  """What a task module defines, read once (None: not defined). UPPERCASE globals: TOOLS, REWARD,
  ROWS (or rows), EVAL_ROWS (or eval_rows), TEST_ROWS (or test_rows), SYSTEM_PROMPT, REWARD_ONLY_FIELDS; functions:
  make_rows, make_eval_rows, make_test_rows, scripted_response (or demo_policy), make_agent,
  tokenizer_corpus, check_rows."""

  module: types.ModuleType
  tools: Sequence | None = None
  reward: Any = None
  rows: Sequence | None = None
  eval_rows: Sequence | None = None
  test_rows: Sequence | None = None
  system_prompt: str | None = None
  reward_only_fields: Sequence[str] | None = None
  make_rows: Callable | None = None
  make_eval_rows: Callable | None = None
  make_test_rows: Callable | None = None
  scripted_response: Callable | None = None
  make_agent: Callable | None = None
  tokenizer_corpus: Callable | None = None
  check_rows: Callable | None = None


def _first(module, *names):
  for n in names:
    value = getattr(module, n, None)
    if value is not None:
      return value
  return None


def _fixed(value):
  return None if value is None or callable(value) else value


def _function(value):
  return value if callable(value) else None


def locked_rows_generator(make_test_rows: Callable | None, fixed_rows: Sequence | None) -> Callable | None:
  """The locked test split's `(n, seed) -> rows`: the task's generator, else its first n fixed test
  rows (the seed does not pick them), else None (the task has no test split)."""
  if make_test_rows is not None:
    return make_test_rows
  if fixed_rows:
    rows = tuple(dict(r) for r in fixed_rows)
    return lambda n, seed: [dict(r) for r in rows[:n]]
  return None


def read_task_module(module: types.ModuleType) -> TaskModule:
  """The task parts `module` defines (the one place a module's globals are read)."""
  return TaskModule(
    module=module,
    tools=_first(module, "TOOLS"),
    reward=_first(module, "REWARD"),
    rows=_fixed(_first(module, "ROWS", "rows")),
    eval_rows=_fixed(_first(module, "EVAL_ROWS", "eval_rows")),
    test_rows=_fixed(_first(module, "TEST_ROWS", "test_rows")),
    system_prompt=_first(module, "SYSTEM_PROMPT"),
    reward_only_fields=_first(module, "REWARD_ONLY_FIELDS"),
    make_rows=_function(_first(module, "make_rows")),
    make_eval_rows=_function(_first(module, "make_eval_rows")),
    make_test_rows=_function(_first(module, "make_test_rows")),
    scripted_response=_first(module, "scripted_response", "demo_policy"),
    make_agent=_function(_first(module, "make_agent")),
    tokenizer_corpus=_function(_first(module, "tokenizer_corpus")),
    check_rows=_function(_first(module, "check_rows")),
  )


def task_spec(task: Any, name: str = "") -> TaskSpec:
  """`task` (a TaskSpec, a `Task`, or a task module) as a TaskSpec; `name` for a Task or module
  (default: the module's last name component, or "custom")."""
  if isinstance(task, TaskSpec):
    return task
  if isinstance(task, types.ModuleType):
    return _from_module(task, name or task.__name__.rpartition(".")[2])
  if isinstance(task, Task):
    return _from_task(task, name or "custom")
  raise TypeError(f"a task must be a TaskSpec, a Task or a task module, got {type(task).__name__}")


def _from_module(module: types.ModuleType, name: str) -> TaskSpec:
  parts = read_task_module(module)
  if parts.tools is None or parts.reward is None:
    raise ValueError(
      f"task module {module.__name__} needs TOOLS and REWARD (a user module: load it "
      "with config.task.module, which also finds its @tool / @reward functions)"
    )
  return TaskSpec(
    name=name,
    tools=tuple(parts.tools),
    reward=parts.reward,
    system_prompt=parts.system_prompt or "",
    rows=tuple(parts.rows or ()),
    eval_rows=tuple(parts.eval_rows or ()),
    generate_rows=parts.make_rows,
    generate_eval_rows=parts.make_eval_rows,
    generate_test_rows=locked_rows_generator(parts.make_test_rows, parts.test_rows),
    corpus=parts.tokenizer_corpus,
    scripted_response=parts.scripted_response,
    agent_factory=parts.make_agent,
    reward_only_fields=REWARD_ONLY_FIELDS if parts.reward_only_fields is None else tuple(parts.reward_only_fields),
    source=module,
  )


def _from_task(task, name: str) -> TaskSpec:
  return TaskSpec(
    name=name,
    tools=tuple(task.tools),
    reward=task.reward,
    system_prompt=task.system_prompt,
    rows=tuple(task.rows),
    eval_rows=tuple(task.eval_rows or ()),
    generate_test_rows=locked_rows_generator(None, task.test_rows),
    extra_corpus=tuple(task.corpus),
    scripted_response=task.scripted_response,
    agent_factory=task.agent_factory,
    agent_fn=task.agent_fn,
    reward_only_fields=tuple(task.reward_only_fields),
    source=task,
  )


@dataclasses.dataclass
class Task:
  """A user-defined task for the Trainer: `Trainer(config, workdir, task=Task(...))` (the trainer
  takes it as `task_spec(task)`).

  Attributes:
    tools: `@tool` functions the agent may call.
    reward: the `@reward` function.
    rows: training rows (dicts with 'question' + fields the reward reads by name).
    eval_rows: held-out rows (default: the first 32 training rows): the dev split, read during training.
    test_rows: the locked test split (default: none), read only by a final evaluation
      (experiments/learning_report.py, `TaskSpec.make_test_rows`), never during training.
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
    agent_cmd: optional outside harness instead of `agent_fn`: a command (string or word list) run
      once per chain with `OPENAI_BASE_URL` / `OPENAI_API_KEY` / `AGENTFLY_ROW` in its environment,
      its stdout the answer (agents/harness.py).
    reward_only_fields: the row fields no agent receives, only the reward (default `REWARD_ONLY_FIELDS`:
      answer, hidden tests, gold actions, ...; data/row_fields.py).
    agent_sandbox: where `agent_cmd` runs: "bwrap" (a bubblewrap sandbox per chain: agents/harness_sandbox.py)
      or "off" (on the host, with the trainer's environment).
    agent_env: names of the trainer's environment variables the sandboxed harness also gets.
    agent_mounts: host folders the sandbox shows read-only (besides the command's program and path arguments).
  """

  tools: Sequence[Any] = ()
  reward: Callable | None = None
  rows: Sequence[dict] = ()
  eval_rows: Sequence[dict] = ()
  test_rows: Sequence[dict] = ()
  system_prompt: str = ""
  corpus: Sequence[str] = ()
  scripted_response: Callable | None = None
  agent_factory: Callable | None = None
  agent_fn: Callable | None = None
  agent_cmd: str | Sequence[str] | None = None
  reward_only_fields: Sequence[str] = REWARD_ONLY_FIELDS
  agent_sandbox: str = "bwrap"
  agent_env: Sequence[str] = ()
  agent_mounts: Sequence[str] = ()

  def __post_init__(self):
    if self.reward is None:
      raise ValueError("Task.reward is missing: give a @reward function (or a plain function)")
    self.reward_only_fields = check_reward_only(self.reward_only_fields, "Task.reward_only_fields")
    if self.agent_cmd:
      from agentfly_jax.agents.harness import command_agent

      if self.agent_fn is not None:
        raise ValueError("Task.agent_cmd and Task.agent_fn are both given: give one agent")
      self.agent_fn = command_agent(
        self.agent_cmd,
        where="Task.agent_cmd",
        sandbox=self.agent_sandbox,
        env_names=tuple(self.agent_env),
        mounts=tuple(self.agent_mounts),
      )
    if self.agent_fn is not None:
      check_agent_fn(self.agent_fn, "Task.agent_fn")
    if not self.rows:
      raise ValueError("Task.rows is empty: give at least one training row")
    for i, row in enumerate(self.rows):
      if not isinstance(row, dict) or not isinstance(row.get("question"), str):
        raise ValueError(f"Task.rows[{i}] needs a string 'question' field, got {row!r:.120}")

  def spec(self, name: str = "custom") -> TaskSpec:
    """This task as the trainer's contract."""
    return task_spec(self, name)

  def make_rows(self, n: int, seed: int) -> list[dict]:
    """n training rows drawn (with replacement) from `rows`."""
    return self.spec().make_rows(n, seed)

  def make_eval_rows(self, n: int, seed: int) -> list[dict]:
    """Held-out rows: `eval_rows` when given, else the first n training rows."""
    return self.spec().make_eval_rows(n, seed)

  def make_test_rows(self, n: int, seed: int) -> list[dict]:
    """The first n `test_rows` (the locked test split); ValueError when the task has none."""
    return self.spec().make_test_rows(n, seed)

  def tokenizer_corpus(self) -> list[str]:
    return self.spec().tokenizer_corpus()

  def make_agent(self, tokenizer):
    return self.spec().make_agent(tokenizer)


def check_agent_fn(fn: Any, where: str) -> None:
  """`fn` must be `[async] def run(client, row)` (trio, asyncio or synchronous: agents/agent_loops.py);
  ValueError naming `where` otherwise."""
  import inspect

  from agentfly_jax.agents.agent_loops import agent_style

  if not callable(fn) or inspect.isclass(fn):
    raise ValueError(
      f"{where} must be a function [async] def run(client, row) -> answer, got {type(fn).__name__} {fn!r:.80}"
    )
  try:
    inspect.signature(fn).bind(None, {})
  except TypeError as e:
    raise ValueError(f"{where} {getattr(fn, '__name__', fn)!r} must take (client, row): {e}") from None
  except ValueError:  # no signature (a builtin): let it run
    pass
  try:
    agent_style(fn)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
