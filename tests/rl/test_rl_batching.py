"""DAPO knobs and trajectory -> array helpers: dynamic sampling drops zero-variance groups,
the overlong penalty counts generated tokens, micro-batch padding rows are fully masked."""

import numpy as np

from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.rl.batching import (
  chain_success,
  drop_zero_variance_groups,
  micro_batch_layout,
  overlong_penalty,
  rollout_metrics,
  to_microbatches,
)


def _traj(group, reward, n_gen=3, calls=()):
  ids = np.arange(8)
  mask = np.zeros(8, bool)
  mask[8 - n_gen :] = True
  return Trajectory(
    token_ids=ids,
    action_mask=mask,
    sampler_logprobs=np.where(mask, -0.5, 0),
    reward=reward,
    group_id=group,
    finish_reason="no_tool_call",
    num_turns=1,
    tool_calls=[{"name": c, "ok": c != "bad"} for c in calls],
  )


def test_dynamic_sampling_keeps_only_groups_with_reward_variance():
  trajs = [_traj(0, 1.0), _traj(0, 1.0), _traj(1, 0.0), _traj(1, 1.0), _traj(2, 0.0), _traj(2, 0.0)]
  kept, dropped = drop_zero_variance_groups(trajs)
  assert dropped == 2 and [t.group_id for t in kept] == [1, 1]


def test_overlong_penalty_is_linear_in_tokens_past_the_buffer_start():
  pen = overlong_penalty(np.array([10, 80, 90, 100, 120]), max_tokens=100, buffer=20, factor=1.0)
  np.testing.assert_allclose(pen, [0, 0, -0.5, -1.0, -2.0])
  assert not overlong_penalty(np.array([500]), max_tokens=100, buffer=0, factor=1.0).any()


def test_microbatches_pad_with_masked_rows_and_keep_order():
  rng = np.random.default_rng(0)
  batch = {
    "token_ids": rng.integers(0, 9, (5, 4)),
    "action_mask": rng.random((5, 4)) < 0.7,
    "advantages": rng.normal(size=(5, 4)),
  }
  rows = np.array([4, 0, 2])
  mb = to_microbatches(batch, rows, micro_batch_size=2, num_micro=3)
  assert mb["token_ids"].shape == (3, 2, 4)
  flat = {k: v.reshape(6, -1) for k, v in mb.items()}
  np.testing.assert_array_equal(flat["token_ids"][:3], batch["token_ids"][rows])
  np.testing.assert_array_equal(flat["action_mask"][:3], batch["action_mask"][rows])
  assert not flat["action_mask"][3:].any()


def test_micro_batch_layout_never_pads_a_small_batch_up_to_the_cap():
  assert micro_batch_layout(8, 16) == (8, 1)
  assert micro_batch_layout(24, 16) == (12, 2)
  assert micro_batch_layout(64, 16) == (16, 4)
  for n in range(1, 80):
    for cap in (1, 3, 8, 16):
      size, num = micro_batch_layout(n, cap)
      assert size <= cap and size * num >= n and size * num - n < num, (n, cap, size, num)
      assert num == -(-n // cap)  # no more micro-batches (sequential steps) than the cap needs
  # a run's train-step layout (the trainer's and memory_plan's): 4 x 6 rows in 2 minibatches of 12
  from types import SimpleNamespace as NS

  from agentfly_jax.rl.batching import minibatch_layout

  rollout, train = NS(rows_per_step=4, num_chains=6), NS(minibatches=2, micro_batch_size=5)
  assert minibatch_layout(rollout, train) == (4, 3)
  assert minibatch_layout(rollout, train, fsdp=4) == (4, 3) and minibatch_layout(rollout, train, fsdp=8) == (8, 3)
  rng = np.random.default_rng(1)
  batch = {"token_ids": rng.integers(0, 9, (8, 4)), "action_mask": np.ones((8, 4), bool)}
  mb = to_microbatches(batch, np.arange(8), micro_batch_size=16)
  assert mb["token_ids"].shape == (1, 8, 4) and mb["action_mask"].all()


def test_rollout_metrics_counts_tools_finish_reasons_and_success():
  trajs = [_traj(0, 1.0, calls=("lookup",)), _traj(0, 0.0, calls=("lookup", "bad")), _traj(1, 0.0)]
  m = rollout_metrics(trajs)
  assert m["rollout/success_rate"] == 1 / 3 and m["rollout/tool_calls/lookup"] == 2 / 3
  assert m["rollout/tool_errors_per_chain"] == 1 / 3 and m["rollout/finish/no_tool_call"] == 1.0
  assert m["rollout/tokens_generated_mean"] == 3.0


def test_success_is_the_rewards_own_success_where_it_reports_one():
  # WebShop: a partial purchase scores 0.25-0.83 (> 0.5 is not success); success is reward 1.0
  rewards, own = [0.83, 0.6, 1.0, 0.25], [0.0, 0.0, 1.0, 0.0]
  trajs = [_traj(0, r) for r in rewards]
  for t, s in zip(trajs, own):
    t.reward_metrics = {"success": s, "r_option": 0.5}
  m = rollout_metrics(trajs, prefix="test")
  assert m["test/success_rate"] == 0.25 and m["test/reward_metric/success"] == 0.25
  trajs[1].reward_metrics = {"r_option": 0.5}  # a chain whose reward reports no success: reward > threshold
  assert rollout_metrics(trajs)["rollout/success_rate"] == 0.5
  assert [chain_success(t) for t in trajs] == [False, True, True, False]


def test_rollout_metrics_panels_turns_tools_errors_envs():
  """AgentFly's panels on random chains: turns (mean/max), calls and errors per tool, environments
  allocated per chain and per type, counted here independently."""
  rng = np.random.default_rng()
  trajs = []
  for g in range(12):
    t = _traj(g, float(rng.random()))
    t.num_turns = int(rng.integers(1, 6))
    t.tool_calls = [
      {"name": str(rng.choice(["search", "python", "answer"])), "ok": bool(rng.random() < 0.7)}
      for _ in range(int(rng.integers(0, 4)))
    ]
    t.env_names = list(rng.choice(["python_sandbox", "redis"], size=int(rng.integers(0, 3)), replace=False))
    trajs.append(t)
  m = rollout_metrics(trajs)
  n = len(trajs)
  assert m["rollout/turns_mean"] == np.mean([t.num_turns for t in trajs])
  assert m["rollout/turns_max"] == max(t.num_turns for t in trajs)
  for name in {c["name"] for t in trajs for c in t.tool_calls}:
    calls = [c for t in trajs for c in t.tool_calls if c["name"] == name]
    assert m[f"rollout/tool_calls/{name}"] == len(calls) / n
    assert m[f"rollout/tool_errors/{name}"] == sum(not c["ok"] for c in calls) / n
  for env in {e for t in trajs for e in t.env_names}:
    assert m[f"rollout/envs/{env}"] == sum(env in t.env_names for t in trajs)
  assert m["rollout/envs_per_chain"] == sum(len(t.env_names) for t in trajs) / n
