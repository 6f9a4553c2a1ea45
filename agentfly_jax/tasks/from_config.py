"""A run's task from its config: a built-in name, or a user task from a module and/or JSON rows.

  config.task = "lookup"                                        # a built-in (agentfly_jax.tasks)
  config.task = custom_task_config(module="my_pkg.my_task")     # @tool / @reward functions (+ rows)
  config.task = custom_task_config(train_path="rows.jsonl", tools="calculator,answer",
                                   reward="exact_match")        # names, or 'module:function'

`build_task(spec)` makes the run's task once (train.py before anything is built, handing it to
`build_run`; evaluation through rl/checkpoints.open_for_evaluation, sweep.py), so a run's saved
config.json rebuilds exactly its task. A module (built-in or `config.task.module`) is read by
tasks/contract.from_module, the config's fields over it; rows are checked as they enter the task
(file, row / line, field; the fields the reward reads; tool names; the module's check_rows), and
`config.task.row_defaults` become the task's row defaults (fields a row gets when it sets none of
them, e.g. the gym id of a Gymnasium task; the module's check_rows names a bad one as
`config.task.row_defaults.<field>`). Also checked before a model is built: the module's import, and a
demonstration policy when `config.sft.steps > 0`.
`task_fingerprint` hashes the task's content (rows, tool names + schemas + code, reward, demo policy)
for the SFT cache key. What a task module may define: tasks/contract.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
from typing import Any, Mapping

import ml_collections

from agentfly_jax.data.dataset import read_rows
from agentfly_jax.user_code import import_user_module


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
    row_defaults: row field -> value, given to a row that sets none of these fields (e.g.
      {"gym_id": "CliffWalking-v1"}: the env of a Gymnasium row, tasks/gym.py; {"openenv_url": ...}:
      an OpenEnv row's server, tasks/openenv.py). A key the config names is a flag of its own
      (`--config.task.row_defaults.gym_id=CliffWalking-v1`, configs/gym_grpo.py); the whole mapping
      is one (`--config.task.row_defaults="{'my_field': 'value'}"`). Values are JSON values.
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
  row_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name != "row_defaults" and not isinstance(value, str):
        raise ValueError(f"config.task.{f.name}={value!r}: must be a string")
    object.__setattr__(self, "row_defaults", _checked_row_defaults(self.row_defaults))
    if self.agent_sandbox not in ("bwrap", "off"):
      raise ValueError(f"config.task.agent_sandbox={self.agent_sandbox!r}: must be 'bwrap' or 'off'")


def _checked_row_defaults(value) -> dict:
  """config.task.row_defaults as a plain dict of field -> JSON value; ValueError naming the field."""
  if hasattr(value, "to_dict"):  # a ConfigDict
    value = value.to_dict()
  if not isinstance(value, Mapping):
    raise ValueError(f"config.task.row_defaults={value!r}: must be a mapping of row field -> value")
  for key, v in value.items():
    if not isinstance(key, str) or not key:
      raise ValueError(f"config.task.row_defaults: key {key!r} must be a row field name (a non-empty string)")
    try:
      json.dumps(v)
    except (TypeError, ValueError):
      raise ValueError(f"config.task.row_defaults.{key}={v!r}: must be a JSON value (a row field's value)") from None
  return dict(value)


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
  """The run's task (tasks/contract.TaskSpec), checked; ValueError names the problem. `task` (a
  `Task` given in Python, or a task module) is taken instead of `config.task`, after the checks that
  need the config. `config`: a ConfigDict, or a RunSpec (anything with `task`, `sft.steps` and `seed`).
  Called once per run (train.py, before anything is built; `build_run` takes what it made)."""
  from agentfly_jax.tasks.contract import from_module, task_spec

  if task is None:
    if is_custom(config):
      task = _custom_task(config)
    else:
      from agentfly_jax.tasks import get_task

      try:
        module = get_task(config.task)
      except ValueError as e:
        raise ValueError(f"config.task={config.task!r}: {e}") from None
      task = from_module(module, config.task)
  task = task_spec(task)
  task.probe(config.seed)
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


def _resolve_tools(spec: str, module) -> list:
  """config.task.tools: names of the module's tools, built-ins or 'module:function' ("" = the module's)."""
  from agentfly_jax.tasks.contract import module_tools
  from agentfly_jax.tools.registry import get_tool

  own = {t.name: t for t in module_tools(module)} if module is not None else {}
  if not spec:
    return list(own.values())
  tools = []
  for name in filter(None, (n.strip() for n in spec.split(","))):
    if name in own:
      tools.append(own[name])
      continue
    try:
      tools.append(get_tool(name))
    except ValueError as e:
      extra = f" (the module's tools: {sorted(own)})" if module is not None else ""
      raise ValueError(f"config.task.tools={spec!r}: {e}{extra}") from None
  return tools


def _resolve_reward(spec: str, module):
  """config.task.reward: a @reward of the module, a built-in name or 'module:function'."""
  from agentfly_jax.rewards import Reward
  from agentfly_jax.rewards.registry import get_reward
  from agentfly_jax.tasks.contract import module_objects

  local = [r for r in module_objects(module, Reward) if r.name == spec] if module is not None else []
  if local:
    return local[0]
  try:
    return get_reward(spec)
  except ValueError as e:
    raise ValueError(f"config.task.reward={spec!r}: {e}") from None


def _custom_task(config):
  """The user task of config.task: its module read by `contract.from_module` (as a built-in's),
  then the config's fields over it (rows from files, tools, reward, MCP servers, agent, ...)."""
  from agentfly_jax.tasks.contract import TaskSpec, from_module, module_reward

  t = user_task_section(config.task)
  module = import_task_module(t.module) if t.module else None
  fields: dict = {"name": t.name or "custom", "row_defaults": dict(t.row_defaults), "row_sources": {}}
  if t.train_path:
    fields.update(rows=read_rows(t.train_path), generate_rows=None)  # checked once, by the task
    fields["row_sources"]["rows"] = t.train_path
  if t.eval_path:
    fields.update(eval_rows=read_rows(t.eval_path), generate_eval_rows=None)
    fields["row_sources"]["eval_rows"] = t.eval_path
  if module is not None:
    label = f"module {t.module}"
    fields["row_sources"] = {
      "rows": f"{label} rows",
      "eval_rows": f"{label} eval rows",
      "test_rows": f"{label} test rows",
      **fields["row_sources"],
    }
  if module is None and not t.train_path:
    raise ValueError(
      "the task has no training rows: set config.task.train_path (a JSON / JSONL "
      "file of rows) or define ROWS / make_rows(n, seed) in config.task.module"
    )
  if t.tools or module is not None:
    fields["tools"] = _resolve_tools(t.tools, module)
  from agentfly_jax.tasks.judged import NO_RULE, judging

  if t.reward:
    fields["reward"] = _resolve_reward(t.reward, module)
  elif judging(config) and (module is None or module_reward(module) is None):
    fields["reward"] = NO_RULE  # no rule reward: config.judge scores the task alone (tasks/judged.py)
  elif module is None:
    raise ValueError(
      "config.task.reward is empty and no task module defines a @reward: set "
      "config.task.reward to a built-in name or 'module:function'"
    )
  if t.mcp_servers:
    from agentfly_jax.tools.mcp import tools_from_config

    try:
      fields["tools"] = list(fields.get("tools", ())) + tools_from_config(t.mcp_servers)
    except (RuntimeError, ValueError) as e:
      raise ValueError(f"config.task.mcp_servers={t.mcp_servers!r}: {e}") from None
    names = [x.name for x in fields["tools"]]
    if len(set(names)) != len(names):
      raise ValueError(f"config.task.mcp_servers={t.mcp_servers!r}: tool names clash: {sorted(names)}")
  if t.system_prompt:
    fields["system_prompt"] = t.system_prompt
  if t.demo_policy:
    from agentfly_jax.user_code import resolve_object

    try:
      fields["scripted_response"] = resolve_object(t.demo_policy, kind="demo policy", builtins={})
    except ValueError as e:
      raise ValueError(f"config.task.demo_policy={t.demo_policy!r}: {e}") from None
  if t.reward_only_fields:
    from agentfly_jax.data.row_fields import check_reward_only

    where = f"config.task.reward_only_fields={t.reward_only_fields!r}"
    fields["reward_only_fields"] = check_reward_only(t.reward_only_fields, where)
  agent_fn, agent_cmd = _resolve_agent_fn(t.agent), _resolve_agent_cmd(t)
  if agent_fn is not None or agent_cmd:
    fields.update(
      agent_fn=agent_fn,
      agent_cmd=agent_cmd,
      agent_sandbox=t.agent_sandbox,
      agent_env=_names(t.agent_env),
      agent_mounts=_names(t.agent_mounts),
    )
  if module is not None:
    return from_module(module, **fields)
  return TaskSpec(**fields)


def _names(text: str) -> tuple[str, ...]:
  return tuple(w.strip() for w in text.split(",") if w.strip())


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
  from agentfly_jax.user_code import resolve_object

  where = f"config.task.agent={spec!r}"
  try:
    fn = resolve_object(spec, kind="agent", builtins={})
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  check_agent_fn(fn, where)
  return fn


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
