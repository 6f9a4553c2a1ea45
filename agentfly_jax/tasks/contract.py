"""The task: one type, `TaskSpec` (constructed as `Task(...)`), whatever the task was written as.

    task = Task(tools=[lookup], reward=code_match, rows=rows)    # a user's task, in Python
    task = from_module(get_task("lookup"))                       # a built-in task module
    task = from_module(import_user_module("my_task"))            # a user's module: read the same way
    task.make_rows(8, seed=0); task.make_agent(tokenizer); task.env_types

A task module defines UPPERCASE globals and functions (all optional but a reward and rows):
  TOOLS (else every @tool defined in the module), REWARD (else its one @reward), ROWS or
  make_rows(n, seed), EVAL_ROWS or make_eval_rows(n, seed) (the dev split), TEST_ROWS or
  make_test_rows(n, seed) (the locked test split, read only by a final evaluation), SYSTEM_PROMPT,
  REWARD_ONLY_FIELDS, scripted_response(prompt_text, use_tool, rng) (the SFT demonstration policy;
  also `demo_policy`), make_agent(tokenizer) (given `system_prompt=` too when it takes one),
  tokenizer_corpus(), check_rows(rows, source) -> rows (its own checks of every row, e.g. swe's
  sandbox runs). `from_module` is the one reader of a module's globals, for built-in and user
  modules alike.

Rows are checked once, here, as they enter the task: a fixed row set when the task is made (a
file's rows as data/dataset.read_rows parsed them, errors naming each row's line), a
generator's rows when they are drawn (`checked_rows`: the row's shape, data/dataset.validate_row; the
fields the reward reads; the row's tools; then the module's own `check_rows`). `row_defaults` fill
fields of a row that sets none of them (e.g. the gym id of a Gymnasium task) before the checks.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import types
from typing import Any, Callable, Mapping, Sequence

from agentfly_jax.data.dataset import row_line, validate_row
from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS, check_reward_only
from agentfly_jax.data.row_stream import RowStream

EVAL_SEED_OFFSET = 999_983  # a generated task without eval rows: make_rows at this seed offset (disjoint rows)
GENERATED_EPOCH_ROWS = 2000  # the rows of a training epoch a generator gives (`epoch_rows`)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A task: tools, a reward, rows (fixed or generated), and how its agent is made.

  Attributes:
    tools: `@tool` functions the agent may call.
    reward: the `@reward` function (or a plain function).
    rows / eval_rows / test_rows: fixed training rows (dicts with 'question' + fields the reward
      reads by name), the dev split (read during training; default: the first training rows) and
      the locked test split (default none; read only by a final evaluation, `make_test_rows`).
    system_prompt: the agent's system prompt ("" = none).
    corpus: extra texts for a random-init model's tiny tokenizer.
    scripted_response: the demonstration policy `(prompt_text, use_tool, rng) -> text` (or
      `[(text, learn), ...]` pieces; `learn=False` pieces stay out of the loss) of the SFT warm
      start (config.sft.steps > 0); one that takes `row=` is given the row it demonstrates (an
      answer the prompt text does not hold, e.g. in a picture).
    agent_factory: `tokenizer -> Agent` (default: a ToolCallAgent over the tools and reward); given
      `system_prompt=` too when it takes one and the task has one.
    agent_fn: a black-box agent `async def run(client, row) -> answer` run against the
      OpenAI-compatible endpoint over the sampler (agents/endpoint_rollout.py) instead of the
      built-in agent loop; the agent (agent_factory / ToolCallAgent) then gives the chat template,
      the tool-call parser and the reward.
    agent_cmd: an outside harness instead of `agent_fn`: a command (string or word list) run once per
      chain with `OPENAI_BASE_URL` / `OPENAI_API_KEY` / `AGENTFLY_ROW` in its environment, its
      stdout the answer (agents/harness.py).
    reward_only_fields: the row fields no agent receives, only the reward and the env grading the
      episode (data/row_fields.py; default `REWARD_ONLY_FIELDS`).
    agent_sandbox / agent_env / agent_mounts: where `agent_cmd` runs ("bwrap": a bubblewrap sandbox
      per chain, or "off"), the trainer's environment variables and the host folders it also gets.
    name: the task's name (plots, logs).
    generate_rows / generate_eval_rows / generate_test_rows: `(n, seed) -> rows` generators (a
      module's make_rows / make_eval_rows / make_test_rows), used where the fixed rows are empty.
    corpus_fn: `() -> texts` replacing the default tokenizer corpus (a module's tokenizer_corpus).
    check_rows: `(rows, source) -> rows`, the module's own checks of every row set.
    row_defaults: fields a row gets when it sets none of them (e.g. {"gym_id": "CliffWalking-v1"}:
      the env a row runs in, for rows that name none).
    row_sources: where the fixed rows came from, by attribute ("rows": "train.json"), for errors.
    source: what the task was made from (a module, or None).
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
  name: str = "custom"
  generate_rows: Callable[[int, int], list] | None = None
  generate_eval_rows: Callable[[int, int], list] | None = None
  generate_test_rows: Callable[[int, int], list] | None = None
  corpus_fn: Callable[[], list] | None = None
  check_rows: Callable[[list, str], list] | None = None
  row_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  row_sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
  source: Any = None

  def __post_init__(self):
    set_ = _setter(self)
    if self.reward is None:
      raise ValueError(f"task {self.name!r}: Task.reward is missing: give a @reward function (or a plain function)")
    set_("tools", tuple(self.tools))
    set_("corpus", tuple(self.corpus))
    set_("agent_env", tuple(self.agent_env))
    set_("agent_mounts", tuple(self.agent_mounts))
    set_("row_defaults", dict(self.row_defaults))
    set_("row_sources", dict(self.row_sources))
    set_("reward_only_fields", check_reward_only(self.reward_only_fields, "Task.reward_only_fields"))
    if self.agent_cmd:
      from agentfly_jax.agents.harness import command_agent

      if self.agent_fn is not None:
        raise ValueError("Task.agent_cmd and Task.agent_fn are both given: give one agent")
      set_(
        "agent_fn",
        command_agent(
          self.agent_cmd,
          where="Task.agent_cmd",
          sandbox=self.agent_sandbox,
          env_names=self.agent_env,
          mounts=self.agent_mounts,
        ),
      )
      set_("agent_cmd", None)  # made into agent_fn once (a replace() of this task keeps it)
    if self.agent_fn is not None:
      check_agent_fn(self.agent_fn, "Task.agent_fn")
    if self.generate_rows is None and not self.rows:
      raise ValueError(
        f"task {self.name!r} has neither rows nor a row generator (make_rows): Task.rows is empty, "
        "give at least one training row"
      )
    for field in ("rows", "eval_rows", "test_rows"):  # fixed rows: checked once, as the task is made
      rows = getattr(self, field)
      set_(field, tuple(self._checked(rows, field)) if rows else ())

  # ------------------------------------------------------------------------------------- rows
  def _where(self, field: str) -> str:
    label = {"rows": "Task.rows", "eval_rows": "Task.eval_rows", "test_rows": "Task.test_rows"}[field]
    return self.row_sources.get(field) or (f"task {self.name!r} {field.replace('_', ' ')}" if self.source else label)

  def _checked(self, rows, field: str) -> list[dict]:
    where = self._where(field)
    return checked_rows(rows, where, self.tools, self.reward, defaults=self.row_defaults, module_check=self.check_rows)

  def make_rows(self, n: int, seed: int) -> list[dict]:
    """n training rows: the generator's at `seed`, else positions 0..n-1 of the fixed rows' stream
    (epochs: every row once per epoch, reshuffled per epoch by `seed`)."""
    if self.generate_rows is not None and not self.rows:
      return self._checked(self.generate_rows(n, seed), "rows")
    return [dict(r) for r in RowStream(self.rows, seed).at(0, n)]

  def epoch_rows(self, seed: int) -> list[dict]:
    """The rows one training epoch covers (data/row_stream.RowStream streams them): the fixed rows,
    else `GENERATED_EPOCH_ROWS` rows of the generator at `seed`."""
    if self.rows:
      return [dict(r) for r in self.rows]
    return self.make_rows(GENERATED_EPOCH_ROWS, seed)

  def make_eval_rows(self, n: int, seed: int) -> list[dict]:
    """n held-out rows (the dev split): the fixed eval rows' first n; else the generator's at
    `seed`; else the first n fixed training rows; else training rows at a disjoint seed."""
    if self.eval_rows:
      return [dict(r) for r in self.eval_rows[:n]]
    if self.generate_eval_rows is not None:
      return self._checked(self.generate_eval_rows(n, seed), "eval_rows")
    if self.rows:
      return [dict(r) for r in self.rows[:n]]
    return self.make_rows(n, seed=EVAL_SEED_OFFSET + seed)

  def make_test_rows(self, n: int, seed: int) -> list[dict]:
    """n rows of the locked test split (for the final evaluation only): the first n fixed test rows
    (the seed does not pick them), else the generator's at `seed`."""
    if self.test_rows:
      return [dict(r) for r in self.test_rows[:n]]
    if self.generate_test_rows is None:
      raise ValueError(f"task {self.name!r} has no locked test split (make_test_rows)")
    return self._checked(self.generate_test_rows(n, seed), "test_rows")

  def split_rows(self, split: str, n: int, seed: int) -> list[dict]:
    """n rows of `split`: "train" (make_rows), "dev" (make_eval_rows: the evals during training) or
    "test" (make_test_rows: the locked split, for a final evaluation only)."""
    make = {"train": self.make_rows, "dev": self.make_eval_rows, "test": self.make_test_rows}.get(split)
    if make is None:
      raise ValueError(f"split {split!r}: must be 'train', 'dev' or 'test'")
    return make(n, seed)

  def probe(self, seed: int = 0) -> None:
    """Draws (and so checks) a few rows of each generator: a generated task's bad rows or row
    defaults (a gym id that does not exist) stop a run before anything is built."""
    if not self.rows:
      self.make_rows(2, seed)
    if not self.eval_rows and self.generate_eval_rows is not None:
      self.make_eval_rows(2, seed)

  # ------------------------------------------------------------------------------------- agent
  def tokenizer_corpus(self) -> list[str]:
    if self.corpus_fn is not None:
      return list(self.corpus_fn())
    texts = [self.system_prompt, *self.corpus]
    texts += [" ".join(str(v) for v in r.values()) for r in self.rows[:2000]]
    texts += [getattr(t, "description", "") or "" for t in self.tools]
    return texts

  def make_agent(self, tokenizer):
    factory = self.agent_factory
    if factory is not None:
      if self.system_prompt and "system_prompt" in inspect.signature(factory).parameters:
        return factory(tokenizer, system_prompt=self.system_prompt)
      return factory(tokenizer)
    from agentfly_jax.agents import ToolCallAgent

    return ToolCallAgent(
      tokenizer, tools=list(self.tools), reward_fn=self.reward, system_prompt=self.system_prompt or None
    )

  def spec(self, name: str | None = None) -> "TaskSpec":
    """This task, named `name` when given (a copy: its rows are not checked again)."""
    if name is None or name == self.name:
      return self
    renamed = copy.copy(self)
    object.__setattr__(renamed, "name", name)
    return renamed

  @property
  def env_types(self) -> tuple[str, ...]:
    """The env-server types the task's tools and reward run in (e.g. ("webshop",))."""
    names = {getattr(t, "env_name", None) for t in (*self.tools, self.reward)}
    return tuple(sorted(n for n in names if n))


Task = TaskSpec  # what a user writes: Task(tools=..., reward=..., rows=...)


def _setter(obj):
  """A setter of a frozen dataclass's fields (for its __post_init__)."""
  return lambda name, value: object.__setattr__(obj, name, value)


# ----------------------------------------------------------------------------------------- rows
def reward_fields(reward) -> list[str]:
  """The dataset fields a reward must find in every row (parameters without defaults that are
  not prediction / trajectory / row / env)."""
  from agentfly_jax.rewards.reward import _SPECIAL

  signature = getattr(reward, "signature", None)
  if signature is None:
    try:
      signature = inspect.signature(reward)
    except (TypeError, ValueError):
      return []
  return [
    n
    for n, p in signature.parameters.items()
    if n not in _SPECIAL and p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
  ]


def checked_rows(
  rows, source: str, tools, reward, *, defaults: Mapping | None = None, module_check: Callable | None = None
) -> list[dict]:
  """`rows` with `defaults` filled in (a row that sets none of their fields gets all of them), each
  checked (data/dataset.validate_row: a string question, a list of tool names), every field the reward
  reads present, a row's `tools` naming only task tools, then `module_check(rows, source)`; ValueError
  naming `source`, the row (and its line, for rows data/dataset.read_rows read from a JSON Lines file)
  and the field."""
  if isinstance(rows, dict) or not isinstance(rows, Sequence):
    raise ValueError(f"{source}: rows must be a list of dicts, got {type(rows).__name__}")
  file_rows = rows

  def row(i: int) -> str:
    line = row_line(file_rows, i)
    return f"row {i}" + (f" (line {line})" if line is not None else "")

  defaults = defaults or {}
  fill = {k: v for k, v in defaults.items() if v not in (None, "")}
  if fill:  # a row that sets any of the defaults' fields keeps its own and gets none of them
    rows = [r if not isinstance(r, dict) or any(r.get(k) for k in defaults) else {**r, **fill} for r in rows]
  rows = [validate_row(r, i, source, line=row_line(file_rows, i)) for i, r in enumerate(rows)]
  if not rows:
    return rows
  name = getattr(reward, "name", getattr(reward, "__name__", "reward"))
  for field in reward_fields(reward):
    lacking = [i for i, r in enumerate(rows) if field not in r]
    if len(lacking) == len(rows):
      raise ValueError(
        f"reward {name!r} reads field {field!r}, which no row of {source} has (row fields: {sorted(rows[0])})"
      )
    if lacking:
      raise ValueError(
        f"{source}: {row(lacking[0])} has no field {field!r}, which reward "
        f"{name!r} reads ({len(lacking)} of {len(rows)} rows lack it)"
      )
  names = {t.name for t in tools}
  for i, r in enumerate(rows):
    unknown = [n for n in r.get("tools") or () if n not in names]
    if unknown:
      raise ValueError(
        f"{source}: {row(i)} field 'tools' names unknown tool(s) {unknown}; the task's tools: {sorted(names)}"
      )
  return list(module_check(rows, source)) if module_check is not None else rows


# ----------------------------------------------------------------------------------------- modules
def _first(module, *names):
  for n in names:
    value = getattr(module, n, None)
    if value is not None:
      return value
  return None


def _fixed(value):
  return () if value is None or callable(value) else tuple(value)


def _function(value):
  return value if callable(value) else None


def module_objects(module, cls) -> list:
  """The module's public `cls` instances: those defined in it, else (none defined) imported ones."""
  found = [v for k, v in vars(module).items() if isinstance(v, cls) and not k.startswith("_")]
  own = [v for v in found if getattr(v.fn, "__module__", None) == module.__name__]
  return own or found


def module_tools(module) -> tuple:
  """The module's TOOLS, else every @tool it defines."""
  from agentfly_jax.tools import Tool

  tools = _first(module, "TOOLS")
  return tuple(tools) if tools is not None else tuple(module_objects(module, Tool))


def module_reward(module):
  """The module's REWARD, else its one @reward (None: it defines none); ValueError for several."""
  from agentfly_jax.rewards import Reward

  found = _first(module, "REWARD")
  if found is not None:
    return found if isinstance(found, Reward) or not callable(found) else Reward(found)
  rewards = module_objects(module, Reward)
  if len(rewards) > 1:
    raise ValueError(
      f"task module {module.__name__!r} defines several rewards {[r.name for r in rewards]}; name one with "
      "REWARD (or config.task.reward)"
    )
  return rewards[0] if rewards else None


def from_module(module: types.ModuleType, name: str = "", **fields) -> TaskSpec:
  """The task `module` defines (see the module docstring), a built-in or a user's alike; `fields`
  (TaskSpec attributes: rows from a file, a config's tools or reward, ...) replace what the module
  gives. `name` default: the module's last name component."""
  reward = fields.pop("reward") if "reward" in fields else module_reward(module)
  parts = dict(
    name=name or module.__name__.rpartition(".")[2],
    tools=fields.pop("tools") if "tools" in fields else module_tools(module),
    reward=reward,
    rows=_fixed(_first(module, "ROWS", "rows")),
    eval_rows=_fixed(_first(module, "EVAL_ROWS", "eval_rows")),
    test_rows=_fixed(_first(module, "TEST_ROWS", "test_rows")),
    system_prompt=_first(module, "SYSTEM_PROMPT") or "",
    generate_rows=_function(_first(module, "make_rows")),
    generate_eval_rows=_function(_first(module, "make_eval_rows")),
    generate_test_rows=_function(_first(module, "make_test_rows")),
    corpus_fn=_function(_first(module, "tokenizer_corpus")),
    scripted_response=_first(module, "scripted_response", "demo_policy"),
    agent_factory=_function(_first(module, "make_agent")),
    check_rows=_function(_first(module, "check_rows")),
    reward_only_fields=tuple(_first(module, "REWARD_ONLY_FIELDS") or REWARD_ONLY_FIELDS),
    source=module,
  )
  parts.update(fields)
  if parts["reward"] is None:
    raise ValueError(
      f"task module {module.__name__} defines no reward (REWARD or one @reward): define one, or name one with "
      "config.task.reward (a built-in name or 'module:function')"
    )
  if not parts["rows"] and parts["generate_rows"] is None:
    raise ValueError(
      f"task module {module.__name__} has no training rows: define ROWS / make_rows(n, seed), or set "
      "config.task.train_path (a JSON / JSONL file of rows)"
    )
  return TaskSpec(**parts)


def task_spec(task: Any, name: str = "") -> TaskSpec:
  """`task` (a TaskSpec / Task, or a task module) as a TaskSpec; `name` names it (a module's
  default: its last name component)."""
  if isinstance(task, TaskSpec):
    return task.spec(name or None)
  if isinstance(task, types.ModuleType):
    return from_module(task, name)
  raise TypeError(f"a task must be a TaskSpec, a Task or a task module, got {type(task).__name__}")


def check_agent_fn(fn: Any, where: str) -> None:
  """`fn` must be `[async] def run(client, row)` (trio, asyncio or synchronous: agents/agent_loops.py);
  ValueError naming `where` otherwise."""
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
