"""The Gymnasium task (agentfly_jax/tasks/gym.py, configs/gym_grpo.py): config.task.row_defaults.gym_id
fills the rows (a flag of its own), a gym id that does not exist stops the run before training naming
it, a gym run saved before row_defaults existed loads with the same task, and scripted
chains play a Gymnasium env through a real env server (its done ends the chain, its return is the
reward)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from absl import flags
from agent_testlib import agent_tokenizer, hermes_call, tokenizer_dir
from envservers_helpers import running_server
from ml_collections import config_flags

from agentfly_jax.agents import run_rollout
from agentfly_jax.data.row_stream import RowStream
from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import gym as gym_task
from agentfly_jax.tasks.from_config import build_task, task_fingerprint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "gym_grpo.py")
# config.json + task.json of a 1-step configs/gym_grpo.py run by commit f80b70b (config.task.gym_id, before
# config.task.row_defaults); its checkpoint is left out: resuming one is tests/e2e/test_saved_run_compat.py's
SAVED_RUN = os.path.join(ROOT, "tests", "data", "run_saved_by_f80b70b_gym")


def _config(**task_fields):
  spec = importlib.util.spec_from_file_location("gym_grpo", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  for key, value in task_fields.items():
    del c.task[key]  # replaced whole (a ConfigDict's update merges mappings)
    c.task[key] = value
  return c


def _from_flags(*args):
  """The config train.py parses from `--config=... <args>` (absl + ml_collections config_flags)."""
  values = flags.FlagValues()
  argv = ["train.py", f"--config={CONFIG}", *args]
  config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
  values(argv)
  return values.config


def test_gym_id_fills_rows_and_a_bad_id_stops_before_training():
  task = build_task(_config())
  rows, eval_rows = task.make_rows(8, seed=0), task.make_eval_rows(8, seed=0)
  assert rows[0]["gym_id"] == "CliffWalking-v1" and eval_rows[0]["gym_id"] == "CliffWalking-v1"
  assert [t.name for t in task.tools] == ["act"]
  assert {r["seed"] for r in rows}.isdisjoint({r["seed"] for r in eval_rows})
  # the seed picks the rows (evaluate.py --seed): the env seeds of the dev rows follow it
  assert [r["seed"] for r in task.make_eval_rows(3, seed=7)] != [r["seed"] for r in eval_rows[:3]]
  with pytest.raises(ValueError, match=r"config\.task\.row_defaults\.gym_id='NoSuchGame-v0'"):
    build_task(_config(row_defaults={"gym_id": "NoSuchGame-v0"}))
  with pytest.raises(ValueError, match=r"config\.task\.row_defaults\.gym_id='no_such_module:Game-v0'.*no_such_module"):
    build_task(_config(row_defaults={"gym_id": "no_such_module:Game-v0"}))
  with pytest.raises(ValueError, match=r"no gym id: set config\.task\.row_defaults\.gym_id"):
    build_task(_config(row_defaults={}))
  with pytest.raises(ValueError, match=r"config\.task\.row_defaults\.gym_id=\{1\}: must be a JSON value"):
    build_task(_config(row_defaults={"gym_id": {1}}))


def test_row_defaults_from_the_command_line():
  """A key the config names is a flag of its own; the whole mapping is one (any field, literal values)."""
  config = _from_flags("--config.task.row_defaults.gym_id=FrozenLake-v1")
  rows = build_task(config).make_rows(2, seed=0)
  assert [r["gym_id"] for r in rows] == ["FrozenLake-v1"] * 2
  config = _from_flags("""--config.task.row_defaults={'gym_id': 'FrozenLake-v1', 'options': {'k': 1}}""")
  assert RunSpec.from_config(config).task.row_defaults == {"gym_id": "FrozenLake-v1", "options": {"k": 1}}


def test_a_gym_run_saved_before_row_defaults_loads_with_the_same_task():
  """configs/from_run.py (a resume or re-train from the run's config.json) migrates config.task.gym_id into
  config.task.row_defaults: the same task section as today's config, and the task it builds has the content
  fingerprint the run recorded (the check evaluate.py makes before evaluating a saved run)."""
  with open(os.path.join(SAVED_RUN, "config.json")) as f:
    saved = json.load(f)
  assert saved["task"]["gym_id"] == "CliffWalking-v1" and "row_defaults" not in saved["task"]  # truly older
  spec = importlib.util.spec_from_file_location("from_run", os.path.join(ROOT, "configs", "from_run.py"))
  from_run = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(from_run)
  config = from_run.get_config(SAVED_RUN)
  assert "gym_id" not in config.task and config.task.row_defaults.to_dict() == {"gym_id": "CliffWalking-v1"}
  run_spec = RunSpec.from_config(config)
  assert run_spec.task == RunSpec.from_config(_config()).task
  task = build_task(run_spec)
  with open(os.path.join(SAVED_RUN, "task.json")) as f:
    recorded = json.load(f)
  rows = RowStream(task.epoch_rows(run_spec.seed), run_spec.seed).rows  # as build_run streams them
  assert task_fingerprint(task, rows) == recorded["fingerprint"]


def test_scripted_chains_play_a_gym_env_through_the_server():
  tok = agent_tokenizer()
  plan = ["0"] + ["1"] * 11 + ["2"]  # CliffWalking: up, along the cliff, down onto the goal

  def script(prompt_ids):
    k = tok.decode(prompt_ids).count("<|im_start|>assistant") - 1
    return tok.encode(hermes_call("act", {"action": plan[min(k, len(plan) - 1)]}) + "<|im_end|>")

  rows = [{"question": gym_task.QUESTION, "gym_id": "CliffWalking-v1", "seed": 0}]
  with running_server("gymnasium=2") as server:
    provider = EnvManager([server.address])
    agent = gym_task.make_agent(tokenizer_dir())
    [traj] = run_rollout(
      agent, rows, sampler=ScriptedSampler(script), max_turns=20, max_total_tokens=8192, env_provider=provider
    )
  assert traj.error is None and traj.num_turns == len(plan)  # the env's done ended the chain
  assert traj.reward == -13.0 and traj.reward_metrics["steps"] == len(plan)
