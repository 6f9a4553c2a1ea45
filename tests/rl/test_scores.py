"""The scores a step trains on (rl/stages.scored: the reward, or a reward metric `loss.score_metric`),
the rows DAPO's dynamic sampling keeps from them, and saved configs holding options this version no longer has (rl/spec.migrate)."""

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
  arrays, metrics = stages.step_arrays(trajs, pad_id=0, dynamic_sampling=True, score_metric="success")
  np.testing.assert_array_equal(arrays["rewards"], [0.0, 1.0, 0.0])  # group 1 never succeeds: no spread, dropped
  assert metrics["dapo/groups_dropped"] == 1
  assert metrics["rollout/reward_mean"] == pytest.approx(np.mean([0.7, 0.4, 0.9, 0.6, 0.6, 0.2]))  # logged: the reward
  assert [t.reward for t in trajs][:2] == [0.7, 0.4]  # the rollout's trajectories are not changed
  plain, _ = stages.step_arrays(trajs, pad_id=0, dynamic_sampling=False)
  np.testing.assert_allclose(plain["rewards"], [0.7, 0.4, 0.9, 0.6, 0.6, 0.2], rtol=1e-6)
  trajs[4].reward_metrics = {"r_type": 1.0}
  with pytest.raises(ValueError, match=r"score_metric='success'.*group 1, chain 1.*\['r_type'\]"):
    stages.step_arrays(trajs, pad_id=0, dynamic_sampling=False, score_metric="success")
  with pytest.raises(ValueError, match=r"group 0, chain 0\).*'note', 'success'"):
    stages.step_arrays(trajs, pad_id=0, dynamic_sampling=False, score_metric="note")


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
