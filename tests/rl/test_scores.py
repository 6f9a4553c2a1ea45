"""The scores a step trains on (rl/stages.scored: the reward, or a reward metric `loss.score_metric`),
the rows DAPO's dynamic sampling keeps from them (the partial-rollout hook `kept_trajectories` keeps the
same), and saved configs holding options this version no longer has (rl/spec.migrate)."""

import numpy as np
import pytest

from agentfly_jax.agents.trajectory import Trajectory


def _trajs(rng, rewards_by_group):
  out = []
  for g, rewards in enumerate(rewards_by_group):
    for c, r in enumerate(rewards):
      n = int(rng.integers(12, 40))
      mask = np.zeros(n, bool)
      mask[4:] = rng.random(n - 4) < 0.8
      lp = np.where(mask, -rng.random(n) * 2, 0).astype(np.float32)
      ids = rng.integers(0, 64, n).astype(np.int32)
      out.append(Trajectory(token_ids=ids, action_mask=mask, sampler_logprobs=lp, reward=r, group_id=g, chain_id=c))
  return out


def test_score_metric_replaces_the_reward_for_advantages_and_names_a_missing_one():
  from agentfly_jax.rl import stages

  rng = np.random.default_rng(3)
  trajs = _trajs(rng, [[0.7, 0.4, 0.9], [0.6, 0.6, 0.2]])
  success = [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
  for t in trajs:
    t.reward_metrics = {"success": success[t.group_id][t.chain_id], "note": "text"}
  arrays, metrics = stages.prepare(trajs, pad_id=0, dynamic_sampling=True, score_metric="success")
  np.testing.assert_array_equal(arrays["rewards"], [0.0, 1.0, 0.0])  # group 1 never succeeds: no spread, dropped
  assert metrics["dapo/groups_dropped"] == 1
  assert metrics["rollout/reward_mean"] == pytest.approx(np.mean([0.7, 0.4, 0.9, 0.6, 0.6, 0.2]))  # logged: the reward
  assert [t.reward for t in trajs][:2] == [0.7, 0.4]  # the rollout's trajectories are not changed
  plain, _ = stages.prepare(trajs, pad_id=0, dynamic_sampling=False)
  np.testing.assert_allclose(plain["rewards"], [0.7, 0.4, 0.9, 0.6, 0.6, 0.2], rtol=1e-6)
  trajs[4].reward_metrics = {"r_type": 1.0}
  with pytest.raises(ValueError, match=r"score_metric='success'.*group 1, chain 1.*\['r_type'\]"):
    stages.prepare(trajs, pad_id=0, dynamic_sampling=False, score_metric="success")
  with pytest.raises(ValueError, match=r"group 0, chain 0\).*'note', 'success'"):
    stages.prepare(trajs, pad_id=0, dynamic_sampling=False, score_metric="note")


def test_kept_trajectories_are_the_rows_prepare_kept():
  from agentfly_jax.rl import stages
  from agentfly_jax.rl.partial_rollout import kept_trajectories

  rng = np.random.default_rng(11)
  rewards = [[0.0, 0.0, 0.0], list(rng.random(3).round(3)), [1.0, 1.0, 1.0]]
  trajs = _trajs(rng, rewards)
  for t in trajs:
    t.reward_metrics = {"success": float(t.reward > 0.5)}
  trajs.append(Trajectory(np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(0, np.float32), group_id=3))  # no row
  for metric in ("", "success"):
    arrays, metrics = stages.prepare(trajs, pad_id=0, dynamic_sampling=True, score_metric=metric)
    kept = kept_trajectories(trajs, dynamic_sampling=True, score_metric=metric)
    want = [t.reward if not metric else t.reward_metrics[metric] for t in kept]
    np.testing.assert_allclose(arrays["rewards"], want, rtol=1e-6)
    assert metrics["dapo/groups_dropped"] == len({t.group_id for t in trajs if len(t.token_ids)}) - len(
      {t.group_id for t in kept}
    )
    assert {t.group_id for t in kept} <= {0, 1, 2} and all(t.group_id != 2 for t in kept)  # group 2: no spread
  assert len(kept_trajectories(trajs, dynamic_sampling=False, score_metric="")) == 9  # the chain with no tokens: none


REMOVED_NEUTRAL = [
  ("rollout", "branch_temperature", 0.0, 2.0),
  ("train", "skip_zero_adv_rows", False, True),
  ("loss", "neg_adv_weight", 1.0, 0.0),
  ("dapo", "cut_turn_penalty", 0.0, 0.5),
]


@pytest.mark.parametrize("section,key,neutral,other", REMOVED_NEUTRAL)
def test_a_saved_config_with_a_removed_option_loads_at_its_neutral_value_only(section, key, neutral, other):
  from agentfly_jax.rl.spec import RunSpec, migrate

  saved = RunSpec().to_dict()
  saved[section][key] = neutral
  saved["eval"]["counted_checkpoint"] = "last_within_budget"  # a one-value option: always dropped
  assert migrate(saved).to_dict() == RunSpec().to_dict()
  assert key in saved[section]  # the caller's dict is left as it was
  saved[section][key] = other
  with pytest.raises(ValueError, match=rf"config\.{section}\.{key}={other!r}: removed option"):
    migrate(saved)


def test_skip_with_the_batch_mean_was_the_plain_update_and_loads():
  """train.skip_zero_adv_rows + skip_keeps_batch_mean made the unskipped update (the skipped rows' advantages
  are 0 and they stayed in the loss's mean), so such a saved run is today's; the skip alone is refused."""
  from agentfly_jax.rl.spec import RunSpec, migrate

  saved = RunSpec().to_dict()
  saved["train"].update(skip_zero_adv_rows=True, skip_keeps_batch_mean=True)
  assert migrate(saved).to_dict() == RunSpec().to_dict()
  saved["train"]["skip_keeps_batch_mean"] = False
  with pytest.raises(ValueError, match=r"config\.train\.skip_zero_adv_rows=True: removed option"):
    migrate(saved)
