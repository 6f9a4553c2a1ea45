"""Per-turn rewards: the rollout records each turn's env step rewards (Trajectory.turn_rewards,
aligned to the assistant turns), the host builds the turn arrays (rewards, anchor states), the
jitted prepare's advantages use them, and the run config selects the estimators."""

import numpy as np
import pytest

from agent_testlib import hermes_call, tokenizer_dir
from agentfly_jax import tool
from agentfly_jax.agents import ToolCallAgent, run_rollout
from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.envs.base import StepResult
from agentfly_jax.rl import stages
from agentfly_jax.rl.config import default_config
from agentfly_jax.rl.core import advantages as A
from agentfly_jax.rl.core.prepare import batch_advantages
from agentfly_jax.rl.update import default_prepare_config
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.rl.turn_rewards import turn_arrays, turn_spans
from agentfly_jax.sampling.scripted import ScriptedSampler


@tool
def move(step: str) -> StepResult:
  """Moves one step in the world.

  Args:
    step: where to.
  """
  return StepResult(observation=f"at {step}", reward=0.25 if step == "east" else 0.5)


def test_rollout_records_one_reward_per_turn_from_the_env_step_results():
  agent = ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[move])
  tok = agent.tokenizer
  replies = [
    hermes_call("move", {"step": "east"}),
    hermes_call("move", {"step": "north"}) + "\n" + hermes_call("move", {"step": "east"}),
    hermes_call("move", {"step": "nowhere", "bad": 1}),  # a failed call: no reward
    "arrived",
  ]

  def script(prompt_ids):
    k = tok.decode(prompt_ids).count("<|im_start|>assistant") - 1
    return tok.encode(replies[min(k, 3)] + "<|im_end|>")

  [t] = run_rollout(agent, [{"question": "go"}], sampler=ScriptedSampler(script), max_turns=6)
  assert t.num_turns == 4 and t.finish_reason == "no_tool_call"
  assert t.turn_rewards == [0.25, 0.75, 0.0, 0.0]
  assert len(turn_spans(t.action_mask)) == t.num_turns  # one run of action tokens per assistant turn
  assert Trajectory(**t.to_json_dict()).turn_rewards == t.turn_rewards


def _traj(segments, group, reward=0.0, turn_rewards=()):
  """segments: ("o", ids) observation / prompt tokens or ("a", ids) model tokens, in order."""
  ids = [i for _, s in segments for i in s]
  mask = [kind == "a" for kind, s in segments for _ in s]
  return Trajectory(
    ids, mask, np.where(mask, -0.5, 0.0), reward=reward, group_id=group, turn_rewards=list(turn_rewards)
  )


def test_turn_arrays_number_identical_observations_once():
  trajs = [
    _traj([("o", [1, 2]), ("a", [5, 6]), ("o", [3]), ("a", [7])], 0, turn_rewards=[0.5, 1.0]),
    _traj([("o", [1, 2]), ("a", [8]), ("o", [3]), ("a", [9]), ("o", [4]), ("a", [9])], 0, turn_rewards=[0, 0, 2]),
    _traj([("o", [1, 2]), ("a", [5])], 1),  # no turn rewards recorded: zeros
  ]
  out = turn_arrays(trajs, multiple=4)
  np.testing.assert_array_equal(out["turn_rewards"], [[0.5, 1, 0, 0], [0, 0, 2, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(out["anchor_ids"], [[0, 1, 0, 0], [0, 1, 2, 0], [0, 0, 0, 0]])
  assert out["anchor_ids"].dtype == np.int32 and out["turn_rewards"].dtype == np.float32
  with pytest.raises(ValueError, match="group 0, chain 0.*3 turn_rewards for 2 model turns"):
    turn_arrays([_traj([("o", [1]), ("a", [5]), ("o", [3]), ("a", [7])], 0, turn_rewards=[1, 2, 3])])


def test_step_arrays_give_the_turn_estimators_their_arrays():
  trajs = [
    _traj([("o", [1, 2]), ("a", [5, 6]), ("o", [3]), ("a", [7])], 0, reward=1.0, turn_rewards=[0.5, 0.0]),
    _traj([("o", [1, 2]), ("a", [8, 8, 8])], 0, reward=0.0, turn_rewards=[0.0]),
  ]
  plain, _ = stages.step_arrays(trajs, pad_id=0, dynamic_sampling=False)
  assert "turn_rewards" not in plain
  arrays, _ = stages.step_arrays(trajs, pad_id=0, dynamic_sampling=False, turn_level=True)
  adv, _, metrics = batch_advantages(default_prepare_config(estimator="gigpo"), arrays)
  # the hand-worked case of test_turn_advantages: turns [0.5, 1] vs [0] -> 2S, S / -2S
  s = 0.5**0.5
  mask = arrays["action_mask"]
  want = np.zeros(mask.shape)
  want[0, [1, 2]], want[0, 4], want[1, [1, 2, 3]] = 2 * s, s, -2 * s  # target-aligned: one position left
  np.testing.assert_allclose(np.asarray(adv), want, atol=1e-5)
  expected, _ = A.compute(
    "gigpo",
    mask=mask,
    scores=arrays["rewards"],
    group_ids=arrays["group_ids"],
    turn_rewards=arrays["turn_rewards"],
    anchor_ids=arrays["anchor_ids"],
  )
  np.testing.assert_allclose(np.asarray(adv), np.asarray(expected), atol=1e-6)


def _spec(algo="grpo", **fields):
  c = default_config().to_dict()
  c["algo"] = algo
  for path, value in fields.items():
    section, key = path.split("__")
    c[section][key] = value
  return RunSpec.from_config(c)


def test_the_run_config_selects_the_turn_estimators():
  assert _spec(loss__estimator="gigpo").algorithm.estimator == "gigpo"
  spec = _spec("ppo", loss__estimator="turn_gae")
  assert spec.algorithm.estimator == "turn_gae" and spec.algorithm.critic
  with pytest.raises(ValueError, match="config.loss.estimator='turn_gae': GAE needs a critic"):
    _spec(loss__estimator="turn_gae")
  with pytest.raises(ValueError, match="num_chains=1"):
    _spec(loss__estimator="gigpo", rollout__num_chains=1)
