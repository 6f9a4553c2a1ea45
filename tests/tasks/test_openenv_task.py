"""The OpenEnv task (agentfly_jax/tasks/openenv.py, configs/openenv_grpo.py): config.task.row_defaults
.openenv_url fills the rows, a URL where no OpenEnv server answers stops the run before training naming the field
and the URL, and scripted chains play a real OpenEnv server (tests/openenv_number_env.py, started
here) through a real env server: OpenEnv's done ends the chain, its summed reward is the reward."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
from agent_testlib import agent_tokenizer, hermes_call, tokenizer_dir
from envservers_helpers import running_server

from agentfly_jax.agents import run_rollout
from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import openenv as openenv_task
from agentfly_jax.tasks.from_config import build_task

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TESTS, "envservers"))
from test_openenv_env import _free_port, openenv_server

CONFIG = "configs/openenv_grpo.py"


def _config(**row_defaults):
  spec = importlib.util.spec_from_file_location("openenv_grpo", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.task.row_defaults.update(row_defaults)
  return c


def test_openenv_url_fills_rows_and_a_dead_url_stops_before_training():
  with openenv_server() as url:
    task = build_task(_config(openenv_url=url))
    rows, eval_rows = task.make_rows(8, seed=0), task.make_eval_rows(8, seed=0)
    assert task.make_eval_rows(2, seed=3) != eval_rows[:2]  # the seed picks the env seeds
  assert rows[0]["openenv_url"] == url and eval_rows[0]["openenv_url"] == url
  assert [t.name for t in task.tools] == ["act"]
  assert {r["seed"] for r in rows}.isdisjoint({r["seed"] for r in eval_rows})
  dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
  with pytest.raises(ValueError, match=r"config\.task\.row_defaults\.openenv_url=.*" + dead.replace(".", r"\.")):
    build_task(_config(openenv_url=dead))
  with pytest.raises(ValueError, match=r"config\.task\.row_defaults\.openenv_url"):
    build_task(_config())  # no server named
  with pytest.raises(ValueError, match=r"config\.task\.row_defaults\.openenv_app"):
    build_task(_config(openenv_app="no_such_module:app"))
  with pytest.raises(ValueError, match=r"names both openenv_url and openenv_app \(config\.task\.row_defaults"):
    build_task(_config(openenv_url=dead, openenv_app="no_such_module:app"))  # both set: before either is probed


def test_scripted_chains_play_an_openenv_server_through_the_env_server():
  tok = agent_tokenizer()
  guesses = []

  def script(prompt_ids):  # binary search on the hints in the last tool reply
    text = tok.decode(prompt_ids)
    low, high = 1, 20
    for guess, hint in zip(guesses, _hints(text)):
      low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
    guess = (low + high) // 2
    guesses[len(_hints(text)) :] = [guess]
    return tok.encode(hermes_call("act", {"action": str(guess)}) + "<|im_end|>")

  with openenv_server() as url:
    rows = [{"question": openenv_task.QUESTION, "openenv_url": url, "seed": 7}]
    with running_server("openenv=2:0") as server:  # no env options: the row names the server
      provider = EnvManager([server.address])
      agent = openenv_task.make_agent(tokenizer_dir())
      [traj] = run_rollout(
        agent, rows, sampler=ScriptedSampler(script), max_turns=8, max_total_tokens=8192, env_provider=provider
      )
  assert traj.error is None and traj.reward == 1.0  # guessed right: OpenEnv's reward
  assert traj.num_turns == traj.reward_metrics["steps"] <= 5  # OpenEnv's done ended the chain


def _hints(text: str) -> list[str]:
  """The hints ("higher" / "lower") of the tool replies so far, in order."""
  out = []
  for line in text.split("<tool_response>")[1:]:
    body = line.split("</tool_response>")[0].strip()
    try:
      out.append(json.loads(body).get("message", ""))
    except ValueError:
      out.append("higher" if "higher" in body else "lower")
  return out
