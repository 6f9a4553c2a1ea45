"""The Gymnasium task (agentfly_jax/tasks/gym.py, configs/gym_grpo.py): config.task.gym_id fills
the rows, a gym id that does not exist stops the run before training naming it, and scripted
chains play a Gymnasium env through a real env server (its done ends the chain, its return is the
reward)."""

from __future__ import annotations

import importlib.util

import pytest

from agent_testlib import agent_tokenizer, hermes_call, tokenizer_dir
from agentfly_jax.agents import run_rollout
from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import gym as gym_task
from agentfly_jax.tasks.from_config import build_task
from envservers_helpers import running_server

CONFIG = "configs/gym_grpo.py"


def _config(**task_fields):
  spec = importlib.util.spec_from_file_location("gym_grpo", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.task.update(task_fields)
  return c


def test_gym_id_fills_rows_and_a_bad_id_stops_before_training():
  task = build_task(_config())
  rows, eval_rows = task.make_rows(8, seed=0), task.make_eval_rows(8, seed=0)
  assert rows[0]["gym_id"] == "CliffWalking-v1" and eval_rows[0]["gym_id"] == "CliffWalking-v1"
  assert [t.name for t in task.tools] == ["act"]
  assert {r["seed"] for r in rows}.isdisjoint({r["seed"] for r in eval_rows})
  # the seed picks the rows (evaluate.py --seed): the env seeds of the dev rows follow it
  assert [r["seed"] for r in task.make_eval_rows(3, seed=7)] != [r["seed"] for r in eval_rows[:3]]
  with pytest.raises(ValueError, match=r"config\.task\.gym_id='NoSuchGame-v0'"):
    build_task(_config(gym_id="NoSuchGame-v0"))
  with pytest.raises(ValueError, match=r"config\.task\.gym_id='no_such_module:Game-v0'.*no_such_module"):
    build_task(_config(gym_id="no_such_module:Game-v0"))


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
