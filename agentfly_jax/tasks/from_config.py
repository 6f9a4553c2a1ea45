"""A run's task from its config: a built-in name, or a user task from a module and/or JSON rows.

  config.task = "lookup"                                        # a built-in (agentfly_jax.tasks)
  config.task = custom_task_config(module="my_pkg.my_task")     # @tool / @reward functions (+ rows)
  config.task = custom_task_config(train_path="rows.jsonl", tools="calculator,answer",
                                   reward="exact_match")        # names, or 'module:function'

`build_task(spec)` is what train.py, evaluate.py, sweep.py and `build_run` all call, so a run's
saved config.json rebuilds exactly its task. Everything is checked before a model is built: rows
(file, row / line, field), the fields the reward reads, tool names, the module's import, and a
demonstration policy when `config.sft.steps > 0`. `task_fingerprint` hashes the task's content
(rows, tool names + schemas + code, reward, demo policy) for the SFT cache key.

A task module may define (all optional but a reward and rows, which may come from the config):
  TOOLS (else every @tool in the module), REWARD (else its one @reward), ROWS or
  make_rows(n, seed), EVAL_ROWS or make_eval_rows(n, seed) (the dev split), TEST_ROWS or
  make_test_rows(n, seed) (the locked test split, read only by experiments/learning_report.py), SYSTEM_PROMPT,
  scripted_response(prompt_text, use_tool, rng) (the SFT demonstration policy; also `demo_policy`),
  make_agent(tokenizer) (given `system_prompt=` too when it takes one), tokenizer_corpus(),
  check_rows(rows, source) -> rows (its own checks of every row, e.g. swe's sandbox runs).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
from typing import Any

import ml_collections

from agentfly_jax.data.dataset import load_rows, validate_row
from agentfly_jax.tools.registry import import_user_module

_NUM_GENERATED_ROWS = 2000  # rows drawn from a module's make_rows (the trainer's stream length)
_NUM_GENERATED_EVAL = 512


@dataclasses.dataclass(frozen=True)
class UserTaskSection:
  """The `config.task` section of a user task (every field overridable by an absl flag).

  Fields:
    name: shown in plots and logs.
    module: a Python module (dotted name, or a .py file) with tools / a reward / rows.
    train_path, eval_path: JSON list or JSON Lines files of rows ({"question": ..., fields}).
    tools: comma-separated tool names: the module's tools, built-ins, or 'module:function'.
    reward: a built-in reward name, a @reward of the module, or 'module:function'.
    system_prompt: the agent's system prompt ("" = the module's SYSTEM_PROMPT, if any).
    demo_policy: 'module:function' demonstration policy for the SFT warm start.
    agent: 'module:function', a black-box agent `async def run(client, row) -> answer` trained
      through the OpenAI-compatible endpoint (`client`: an openai.AsyncOpenAI); "" = the
      built-in agent loop.
    agent_cmd: an outside harness command run per chain against the endpoint (agents/harness.py).
    agent_sandbox: where agent_cmd runs: "bwrap" (a bubblewrap sandbox per chain) | "off" (on the host).
    agent_env: comma-separated names of the trainer's environment variables the sandboxed harness also gets.
    agent_mounts: comma-separated host folders its sandbox shows read-only (beside its program and arguments).
    reward_only_fields: comma-separated row fields no agent sees, only the reward ("" = the module's
      REWARD_ONLY_FIELDS, else data/row_fields.REWARD_ONLY_FIELDS).
    mcp_servers: MCP servers to start / connect to, separated by ';': a command line (stdio) or
      an http(s) URL (streamable HTTP); all their tools join the task's tools (tools/mcp.py).
    gym_id: a Gymnasium env id for rows that name none (module agentfly_jax.tasks.gym).
    openenv_url, openenv_app: an OpenEnv server (http://host:port) or app (module:attr, started
      per pool) for rows that name none (module agentfly_jax.tasks.openenv).
  """

  name: str = "custom"
  module: str = ""
  train_path: str = ""
  eval_path: str = ""
  tools: str = ""
  reward: str = ""
  system_prompt: str = ""
  demo_policy: str = ""
  agent: str = ""
  agent_cmd: str = ""
  agent_sandbox: str = "bwrap"
  agent_env: str = ""
  agent_mounts: str = ""
  reward_only_fields: str = ""
  mcp_servers: str = ""
  gym_id: str = ""
  openenv_url: str = ""
  openenv_app: str = ""

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if not isinstance(value, str):
        raise ValueError(f"config.task.{f.name}={value!r}: must be a string")
    if self.agent_sandbox not in ("bwrap", "off"):
      raise ValueError(f"config.task.agent_sandbox={self.agent_sandbox!r}: must be 'bwrap' or 'off'")


def custom_task_config(**overrides) -> ml_collections.ConfigDict:
  """The `config.task` section of a user task (`UserTaskSection`'s fields) as a ConfigDict."""
  c = ml_collections.ConfigDict(dataclasses.asdict(UserTaskSection()))
  c.update(overrides)
  return c


def set_custom_task(config, **fields) -> ml_collections.ConfigDict:
  """Replaces `config.task` (a built-in name) by a user task section (`custom_task_config`)."""
  if "task" in config:
    del config["task"]  # a str field cannot be overridden by a section
  config.task = custom_task_config(**fields)
  return config


def user_task_section(task) -> UserTaskSection:
  """`config.task` (a user task's ConfigDict or dict, maybe saved before some fields existed:
  they get their defaults) as a UserTaskSection; an unknown field is an error naming it."""
  if isinstance(task, UserTaskSection):
    return task
  values = dict(task.items())
  known = [f.name for f in dataclasses.fields(UserTaskSection)]
  unknown = sorted(set(values) - set(known))
  if unknown:
    raise ValueError(f"config.task.{unknown[0]}: unknown field; a user task has {known}")
  return UserTaskSection(**values)


def task_name(config) -> str:
  """A short name of the config's task (for plot titles and logs)."""
  t = config.task
  return t if isinstance(t, str) else (user_task_section(t).name or "custom")


def is_custom(config) -> bool:
  return not isinstance(config.task, str)


def absolutize_paths(config) -> None:
  """Makes the task's file paths absolute (before config.json is saved), so a run's saved config
  rebuilds the same task from any working directory."""
  if not is_custom(config):  # a built-in name holds no paths
    return
  t = config.task
  for field in ("train_path", "eval_path"):
    if t.get(field):
      t[field] = os.path.abspath(t[field])
  if t.get("module") and _is_file_module(t.module):
    t.module = os.path.abspath(t.module)


def build_task(config, task: Any = None):
  """The run's task as the trainer's contract (tasks/contract.TaskSpec), validated; ValueError
  names the problem. `task` (a `Task` or TaskSpec given in Python) is taken instead of
  `config.task`, after the checks that need the config. `config`: a ConfigDict, or a RunSpec
  (anything with `task`, `sft.steps` and `seed`)."""
  from agentfly_jax.tasks.contract import task_spec

  if task is None:
    if is_custom(config):
      task = _custom_task(config)
    else:
      from agentfly_jax.tasks import get_task

      try:
        task = get_task(config.task)
      except ValueError as e:
        raise ValueError(f"config.task={config.task!r}: {e}") from None
  task = task_spec(task, task_name(config))
  check_demo_policy(config, task)
  from agentfly_jax.tasks.judged import with_judge

  return with_judge(config, task)  # config.judge: a judge model's reward (the URL probed here)


def check_demo_policy(config, task) -> None:
  """`sft.steps > 0` needs the task's demonstration policy (`scripted_response`)."""
  if config.sft.steps > 0 and task.scripted_response is None:
    raise ValueError(
      f"config.sft.steps={config.sft.steps}: the SFT warm start imitates a demonstration "
      f"policy, and task {task_name(config)!r} has none; define scripted_response(prompt_text, "
      f"use_tool, rng) in the task module or set config.task.demo_policy='module:function', "
      f"or set config.sft.steps=0"
    )


# --------------------------------------------------------------------------- user tasks
def _is_file_module(spec: str) -> bool:
  return spec.endswith(".py") or os.sep in spec


def import_task_module(spec: str):
  """The module `spec` (dotted name, or a .py file path); ValueError naming it if it does not import."""
  where = f"config.task.module={spec!r}"
  try:
    return import_user_module(spec)
  except Exception as e:  # noqa: BLE001 — whatever the user's module raised, name it
    raise ValueError(f"{where}: the module does not import: {type(e).__name__}: {e}") from None


def _module_objects(module, cls) -> list:
  """The module's public `cls` instances: those defined in it, else (none defined) imported ones."""
  found = [v for k, v in vars(module).items() if isinstance(v, cls) and not k.startswith("_")]
  own = [v for v in found if getattr(v.fn, "__module__", None) == module.__name__]
  return own or found


def _resolve_tools(spec: str, parts) -> list:
  """`parts`: the task module's (contract.TaskModule) or None."""
  from agentfly_jax.tools import Tool
  from agentfly_jax.tools.registry import get_tool

  module = parts.module if parts is not None else None
  module_tools = {}
  if module is not None:
    found = parts.tools
    for t in found if found is not None else _module_objects(module, Tool):
      module_tools[t.name] = t
  if not spec:
    return list(module_tools.values())
  tools = []
  for name in filter(None, (n.strip() for n in spec.split(","))):
    if name in module_tools:
      tools.append(module_tools[name])
      continue
    try:
      tools.append(get_tool(name))
    except ValueError as e:
      extra = f" (the module's tools: {sorted(module_tools)})" if module is not None else ""
      raise ValueError(f"config.task.tools={spec!r}: {e}{extra}") from None
  return tools


def _resolve_reward(spec: str, parts):
  from agentfly_jax.rewards import Reward
  from agentfly_jax.rewards.registry import get_reward

  module = parts.module if parts is not None else None
  if spec:
    local = [r for r in _module_objects(module, Reward) if r.name == spec] if module else []
    if local:
      return local[0]
    try:
      return get_reward(spec)
    except ValueError as e:
      raise ValueError(f"config.task.reward={spec!r}: {e}") from None
  if module is not None:
    found = parts.reward
    if found is not None:
      return found if isinstance(found, Reward) else Reward(found)
    rewards = _module_objects(module, Reward)
    if len(rewards) == 1:
      return rewards[0]
    if len(rewards) > 1:
      raise ValueError(
        f"config.task.module={module.__name__!r} defines several rewards "
        f"{[r.name for r in rewards]}; name one with config.task.reward or REWARD"
      )
  raise ValueError(
    "config.task.reward is empty and no task module defines a @reward: set "
    "config.task.reward to a built-in name or 'module:function'"
  )


def _module_rows(rows, make, n: int, seed: int):
  """A module's fixed rows, else its generator's n rows, else None."""
  if rows is not None:
    return list(rows)
  return list(make(n, seed)) if make is not None else None


def _fill_row_fields(rows: list[dict], t: UserTaskSection) -> list[dict]:
  """Rows with config.task's gym_id / openenv_url / openenv_app where they name no env of their own."""
  if t.gym_id:
    rows = [{**r, "gym_id": r.get("gym_id") or t.gym_id} for r in rows]
  if t.openenv_url and t.openenv_app:
    raise ValueError("config.task.openenv_url and config.task.openenv_app are both set; set one")
  if t.openenv_url or t.openenv_app:
    fill = {"openenv_url": t.openenv_url} if t.openenv_url else {"openenv_app": t.openenv_app}
    rows = [r if r.get("openenv_url") or r.get("openenv_app") else {**r, **fill} for r in rows]
  return rows


def _custom_task(config):
  from agentfly_jax.tasks import Task
  from agentfly_jax.tasks.contract import TaskModule, read_task_module, task_spec, locked_rows_generator

  t = user_task_section(config.task)
  module = import_task_module(t.module) if t.module else None
  parts = read_task_module(module) if module is not None else TaskModule(module=None)
  mod_label = f"module {t.module}" if module is not None else ""
  if t.train_path:
    rows, source = load_rows(t.train_path), t.train_path
  else:
    rows, source = _module_rows(parts.rows, parts.make_rows, _NUM_GENERATED_ROWS, config.seed), mod_label
    if rows is None:
      raise ValueError(
        "the task has no training rows: set config.task.train_path (a JSON / JSONL "
        "file of rows) or define ROWS / make_rows(n, seed) in config.task.module"
      )
    rows = [validate_row(r, i, f"{source} rows") for i, r in enumerate(rows)]
    if not rows:
      raise ValueError(f"{source}: the training rows are empty")
  rows = _fill_row_fields(rows, t)
  eval_rows, eval_source = [], source
  if t.eval_path:
    eval_rows, eval_source = load_rows(t.eval_path), t.eval_path
  elif module is not None:
    eval_rows = _module_rows(parts.eval_rows, parts.make_eval_rows, _NUM_GENERATED_EVAL, config.seed) or []
    eval_source = f"{mod_label} eval rows"
    eval_rows = [validate_row(r, i, eval_source) for i, r in enumerate(eval_rows)]
  eval_rows = _fill_row_fields(eval_rows, t)
  tools = _resolve_tools(t.tools, parts if module is not None else None)
  try:
    reward = _resolve_reward(t.reward, parts if module is not None else None)
  except ValueError:
    from agentfly_jax.tasks.judged import NO_RULE, judging

    if t.reward or not judging(config):
      raise
    reward = NO_RULE  # no rule reward: config.judge scores the task alone (tasks/judged.py)
  if t.mcp_servers:
    from agentfly_jax.tools.mcp import tools_from_config

    try:
      tools += tools_from_config(t.mcp_servers)
    except (RuntimeError, ValueError) as e:
      raise ValueError(f"config.task.mcp_servers={t.mcp_servers!r}: {e}") from None
    names = [x.name for x in tools]
    if len(set(names)) != len(names):
      raise ValueError(f"config.task.mcp_servers={t.mcp_servers!r}: tool names clash: {sorted(names)}")
  check_rows_fit(rows, source, tools, reward)
  if eval_rows:
    check_rows_fit(eval_rows, eval_source, tools, reward)
  demo = parts.scripted_response
  if t.demo_policy:
    from agentfly_jax.tools.registry import resolve_object

    try:
      demo = resolve_object(t.demo_policy, kind="demo policy", builtins={})
    except ValueError as e:
      raise ValueError(f"config.task.demo_policy={t.demo_policy!r}: {e}") from None
  check = parts.check_rows
  if check is not None:  # the module's own row checks (e.g. swe: each row run in the sandbox)
    rows = check(rows, source or "rows")
    eval_rows = check(eval_rows, eval_source or "eval rows") if eval_rows else eval_rows
  corpus_fn = parts.tokenizer_corpus
  system_prompt = t.system_prompt or parts.system_prompt or ""
  agent_factory = parts.make_agent
  if agent_factory is not None and "system_prompt" in inspect.signature(agent_factory).parameters:
    agent_factory = functools.partial(agent_factory, system_prompt=system_prompt)
  custom = Task(
    tools=tools,
    reward=reward,
    rows=rows,
    eval_rows=eval_rows,
    system_prompt=system_prompt,
    corpus=list(corpus_fn()) if corpus_fn is not None else (),
    scripted_response=demo,
    agent_factory=agent_factory,
    agent_fn=_resolve_agent_fn(t.agent),
    agent_cmd=_resolve_agent_cmd(t),
    agent_sandbox=t.agent_sandbox,
    agent_env=_names(t.agent_env),
    agent_mounts=_names(t.agent_mounts),
    reward_only_fields=_reward_only(t, parts),
  )
  # the module's locked test split (make_test_rows at the final evaluation's seed, or TEST_ROWS), read only then:
  # its rows are checked as the eval rows are, when they are read
  generate = locked_rows_generator(parts.make_test_rows, parts.test_rows)
  if generate is None:
    return custom

  def test_rows(n: int, seed: int) -> list[dict]:
    where = f"{mod_label} test rows"
    rows = _fill_row_fields([validate_row(r, i, where) for i, r in enumerate(generate(n, seed))], t)
    if rows:
      check_rows_fit(rows, where, tools, reward)
    if rows and check is not None:
      rows = check(rows, where)
    return rows

  return dataclasses.replace(task_spec(custom, task_name(config)), generate_test_rows=test_rows)


def _names(text: str) -> tuple[str, ...]:
  return tuple(w.strip() for w in text.split(",") if w.strip())


def _reward_only(t, parts) -> tuple[str, ...]:
  """config.task.reward_only_fields, else the module's REWARD_ONLY_FIELDS, else the default set."""
  from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS, check_reward_only

  if t.reward_only_fields:
    return check_reward_only(t.reward_only_fields, f"config.task.reward_only_fields={t.reward_only_fields!r}")
  return REWARD_ONLY_FIELDS if parts.reward_only_fields is None else tuple(parts.reward_only_fields)


def _resolve_agent_cmd(t) -> str | None:
  """config.task.agent_cmd, checked (its program exists); None if ""."""
  if not t.agent_cmd:
    return None
  from agentfly_jax.agents.harness import command_words

  if t.agent:
    raise ValueError(f"config.task.agent_cmd={t.agent_cmd!r} and config.task.agent={t.agent!r}: give one agent")
  command_words(t.agent_cmd, "config.task.agent_cmd")
  return t.agent_cmd


def _resolve_agent_fn(spec: str):
  """config.task.agent ('module:function') -> the async agent function, checked; None if ""."""
  if not spec:
    return None
  from agentfly_jax.tasks import check_agent_fn
  from agentfly_jax.tools.registry import resolve_object

  where = f"config.task.agent={spec!r}"
  try:
    fn = resolve_object(spec, kind="agent", builtins={})
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  check_agent_fn(fn, where)
  return fn


def reward_fields(reward) -> list[str]:
  """The dataset fields a reward must find in every row (parameters without defaults that are
  not prediction / trajectory / row / env)."""
  from agentfly_jax.rewards.reward import _SPECIAL

  return [
    n
    for n, p in reward.signature.parameters.items()
    if n not in _SPECIAL and p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
  ]


def check_rows_fit(rows: list[dict], source: str, tools: list, reward) -> None:
  """Every field the reward reads is in every row, and a row's `tools` names only task tools."""
  for field in reward_fields(reward):
    lacking = [i for i, r in enumerate(rows) if field not in r]
    if len(lacking) == len(rows):
      raise ValueError(
        f"reward {reward.name!r} reads field {field!r}, which no row of {source} has (row fields: {sorted(rows[0])})"
      )
    if lacking:
      raise ValueError(
        f"{source}: row {lacking[0]} has no field {field!r}, which reward "
        f"{reward.name!r} reads ({len(lacking)} of {len(rows)} rows lack it)"
      )
  names = {t.name for t in tools}
  for i, r in enumerate(rows):
    unknown = [n for n in r.get("tools") or () if n not in names]
    if unknown:
      raise ValueError(
        f"{source}: row {i} field 'tools' names unknown tool(s) {unknown}; the task's tools: {sorted(names)}"
      )


# --------------------------------------------------------------------------- content hash
def _source(obj) -> str:
  fn = getattr(obj, "fn", obj)
  try:
    return inspect.getsource(fn)
  except (OSError, TypeError):
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"


def task_fingerprint(task, train_rows=None) -> str:
  """sha256 of what a task (a TaskSpec, or anything `contract.task_spec` takes) trains on: rows,
  tool names + schemas + code, reward name + code, system prompt, demonstration policy code (hex,
  16 characters)."""
  from agentfly_jax.tasks.contract import task_spec

  task = task_spec(task)
  reward, demo = task.reward, task.scripted_response
  content = {
    "rows": list(train_rows if train_rows is not None else task.rows),
    "eval_rows": list(task.eval_rows),
    "tools": [[t.name, t.schema, _source(t)] for t in task.tools],
    "reward": [getattr(reward, "name", ""), _source(reward) if reward is not None else ""],
    "system_prompt": task.system_prompt,
    "demo_policy": _source(demo) if demo is not None else "",
  }
  agent_fn = task.agent_fn
  if agent_fn is not None:  # only then: the fingerprints of tasks without one stay as they were
    content["agent_fn"] = _source(agent_fn)
    content["reward_only_fields"] = list(task.reward_only_fields)  # what of each row the agent is given
    if getattr(agent_fn, "command", None):  # an outside harness: its command
      content["agent_cmd"] = list(agent_fn.command)
  text = json.dumps(content, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]
