"""@reward: arguments by parameter name, float or dict results, async, clear errors."""

import math

import numpy as np
import pytest
import trio

from agentfly_jax import reward
from agentfly_jax.rewards import Reward, exact_match, last_number, normalize_reward, numeric_match

MESSAGES = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "4"}]


def compute(r, prediction="4", trajectory=MESSAGES, row=None, env=None):
  return trio.run(lambda: r.compute(prediction, trajectory, row or {}, env))


def test_fields_by_parameter_name_and_float_result():
  @reward
  def graded(prediction, answer, difficulty=1.0):
    return float(prediction == answer) * difficulty

  assert isinstance(graded, Reward) and graded.name == "graded"
  assert compute(graded, row={"question": "q", "answer": "4", "difficulty": 0.5}) == {"reward": 0.5}
  assert compute(graded, row={"question": "q", "answer": "5"}) == {"reward": 0.0}
  assert graded("4", "4") == 1.0  # direct call is the function itself


def test_dict_result_metrics_trajectory_row_and_kwargs():
  @reward(name="shaped")
  def shaped(prediction, trajectory, row, **fields):
    return {"reward": np.float32(0.25), "turns": len(trajectory), "n_fields": len(fields), "has_row": "question" in row}

  out = compute(shaped, row={"question": "q", "answer": "4", "extra": 1})
  assert out == {"reward": 0.25, "turns": 2, "n_fields": 3, "has_row": True}
  assert shaped.name == "shaped" and isinstance(out["reward"], float)


def test_async_and_env_bound_rewards():
  @reward
  async def slow(prediction):
    await trio.sleep(0.01)
    return 1

  class Env:
    async def compute_reward(self, name, **kwargs):
      return {"reward": 3.0}

  @reward(env="python_sandbox")
  async def in_env(env, prediction):
    return await env.compute_reward("tests_pass", code=prediction)

  assert compute(slow) == {"reward": 1.0}
  assert compute(in_env, env=Env()) == {"reward": 3.0}
  with pytest.raises(ValueError, match="needs env="):
    reward(lambda env: 1.0)


def test_missing_field_and_bad_results_name_the_reward():
  @reward
  def needs_answer(prediction, answer):
    return 1.0

  with pytest.raises(KeyError, match="reward 'needs_answer' needs dataset field 'answer'"):
    compute(needs_answer, row={"question": "q"})
  with pytest.raises(TypeError, match="reward 'bad' must return a number"):
    normalize_reward("bad", "high")
  with pytest.raises(ValueError, match="without a 'reward' key"):
    normalize_reward("bad", {"score": 1})
  with pytest.raises(ValueError, match="non-finite"):
    normalize_reward("bad", math.nan)
  assert normalize_reward("ok", True) == {"reward": 1.0}


def test_builtin_rewards():
  assert compute(exact_match, prediction=" Paris. ", row={"answer": "paris"}) == {"reward": 1.0}
  assert compute(exact_match, prediction=None, row={"answer": "paris"}) == {"reward": 0.0}
  assert compute(numeric_match, prediction="so 1,024.0 total", row={"answer": "1024"}) == {
    "reward": 1.0,
    "has_number": 1.0,
  }
  assert compute(numeric_match, prediction="none", row={"answer": "3"})["reward"] == 0.0
  assert last_number("a -3.5e2 b") == -350.0 and last_number("x") is None
