"""Learning from the better chains only: `loss.neg_adv_weight` scales negative advantages in the
prepare call (0: only above-baseline chains train), and `train.skip_zero_adv_rows` leaves rows
with no advantage out of the train steps, which then train exactly as if those rows were never
in the batch (fewer micro-batches: the compute they would have cost is saved)."""

import dataclasses
import importlib.util
import os

import jax
import numpy as np
import pytest
from train_cli import ROOT

from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.rl.batching import train_arrays
from agentfly_jax.rl.update import ModelParts, PolicyUpdate, few_sizes


def test_few_sizes_rounds_up_by_under_one_and_a_half():
  assert [few_sizes(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
  for n in range(1, 500):
    assert n <= few_sizes(n) <= 1.5 * n
  assert len({few_sizes(n) for n in range(1, 1025)}) == 20  # 1, 2, 3, then 2^k and 3 * 2^k up to 1024


def _config(tmp_path, **loss):
  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, "configs", "lookup_grpo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.sft.steps, c.log.tensorboard, c.log.progress = 0, False, False
  c.train.micro_batch_size = 2
  for k, v in loss.items():
    c.loss[k] = v
  return c


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


def _update(trainer, **train):
  spec = dataclasses.replace(trainer.spec, train=dataclasses.replace(trainer.spec.train, **train))
  parts = ModelParts(trainer.run.parts.policy.graphdef, trainer.run.parts.policy.rest, trainer.run.optimizer)
  return PolicyUpdate(
    parts, spec, trainer.run.loss_cfg, spec.algorithm.estimator, trainer.run.parts.mesh, trainer.run.states.sharding
  )


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
  from agentfly_jax.rl.trainer import Trainer

  return Trainer(_config(tmp_path_factory.mktemp("run"), neg_adv_weight=0.25), str(tmp_path_factory.mktemp("w")))


def test_negative_advantages_are_scaled_positive_ones_kept(trainer):
  rng_seed = int(np.random.SeedSequence().entropy % 2**31)  # fresh rewards each run (named on failure)
  rng = np.random.default_rng(rng_seed)
  rewards = [list(rng.random(4).round(3)) for _ in range(3)]
  arrays = train_arrays(_trajs(rng, rewards), pad_id=0)
  state = trainer.new_state(trainer.run.parts.policy.params)
  batch, _ = trainer.run.update.prepare(
    state.params, None, None, trainer.run.update.put_arrays(arrays), trainer.run.update.frozen
  )
  adv = np.asarray(jax.device_get(batch["advantages"]))[: len(arrays["rewards"])]
  mask = arrays["action_mask"]
  for i, r in enumerate(np.asarray(rewards).ravel()):  # GRPO by hand: (r - group mean) / (unbiased std + eps)
    group = np.asarray(rewards[i // 4], np.float64)
    want = (r - group.mean()) / (group.std(ddof=1) + 1e-6)
    want = want if want >= 0 else 0.25 * want
    np.testing.assert_allclose(adv[i][mask[i]], want, rtol=1e-4, atol=1e-5, err_msg=f"row {i} (seed {rng_seed})")
    assert not adv[i][~mask[i]].any()


def test_skipped_rows_train_as_if_absent_and_cost_nothing(trainer):
  """Group 0's rewards are equal (no advantage anywhere): skipping its rows gives the step of the
  batch without them (same loss and gradient); not skipping trains on an average over more rows."""
  rng = np.random.default_rng(7)
  rewards = [[0.5, 0.5, 0.5, 0.5], [0.0, 1.0, 0.3, 0.6], [0.9, 0.2, 0.2, 0.4]]
  trajs = _trajs(rng, rewards)
  full = train_arrays(trajs, pad_id=0, length=48)
  rest = train_arrays(trajs[4:], pad_id=0, length=48)
  skip, plain = _update(trainer, skip_zero_adv_rows=True), _update(trainer, skip_zero_adv_rows=False)
  got = {}
  for name, upd, arrays in (("skip", skip, full), ("absent", plain, rest), ("plain", plain, full)):
    _, m = upd(trainer.new_state(trainer.run.parts.policy.params), None, arrays, step=1)
    got[name] = m.fetch()
  # neg_adv_weight 0.25: group 1 and 2's rows all carry an advantage; group 0's none
  assert got["skip"]["train/rows_trained"] == 8 and got["plain"]["train/rows_trained"] == 12
  for k in ("actor/pg_loss", "actor/grad_norm", "actor/loss_denom"):
    assert got["skip"][k] == pytest.approx(got["absent"][k], rel=1e-5, abs=1e-7), k
  assert got["plain"]["actor/loss_denom"] == pytest.approx(1.5 * got["skip"]["actor/loss_denom"], rel=1e-6)
  # 8 rows in 4 micro-batches of 2, not the layout's 6: no slot computed for the skipped rows
  assert got["skip"]["train/padding_fraction"] < got["plain"]["train/padding_fraction"] + 1e-9
  # log-probs only for the rows that train (their mismatch metrics are the absent batch's); the
  # advantages' metrics are the whole batch's
  mismatch = [k for k in got["plain"] if k.startswith("mismatch/")]
  assert mismatch and all(got["skip"][k] == pytest.approx(got["absent"][k], rel=1e-5, abs=1e-7) for k in mismatch)
  assert any(got["plain"][k] != pytest.approx(got["absent"][k], rel=1e-3) for k in mismatch)
  assert got["skip"]["adv/abs_mean"] == pytest.approx(got["plain"]["adv/abs_mean"], rel=1e-6)


def test_a_batch_with_no_advantage_leaves_the_state_as_it_was(trainer):
  rng = np.random.default_rng(11)
  arrays = train_arrays(_trajs(rng, [[0.3] * 4, [1.0] * 4]), pad_id=0)
  state = trainer.new_state(trainer.run.parts.policy.params)
  before = jax.device_get(jax.tree.leaves(state.params))
  new, m = _update(trainer, skip_zero_adv_rows=True)(state, None, arrays, step=1)
  got = m.fetch()
  assert got["train/rows_trained"] == 0 and "actor/pg_loss" not in got and got["adv/abs_mean"] == 0
  for a, b in zip(before, jax.device_get(jax.tree.leaves(new.params))):
    np.testing.assert_array_equal(a, b)


def test_skipping_needs_a_loss_without_terms_on_every_row(tmp_path):
  from agentfly_jax.rl.spec import RunSpec

  for loss in ({"kl_coef": 0.1}, {"entropy_coef": 0.01}):
    c = _config(tmp_path, **loss)
    c.train.skip_zero_adv_rows = True
    with pytest.raises(ValueError, match=r"config\.train\.skip_zero_adv_rows.*KL, entropy or critic"):
      RunSpec.from_config(c)
  c = _config(tmp_path, neg_adv_weight=-0.5)
  with pytest.raises(ValueError, match=r"config\.loss\.neg_adv_weight=-0\.5: must be >= 0"):
    RunSpec.from_config(c)


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


def test_a_cut_chain_scores_its_reward_minus_the_cut_turn_penalty():
  """`dapo.cut_turn_penalty`: a chain that ended because a turn ran to max_tokens_per_turn trains on
  reward - penalty (below a wrong answer's 0), on top of `score_metric`; dynamic sampling sees the
  penalised scores (a group of zeros with a cut chain has a spread); the logged rewards stay the rollout's."""
  from agentfly_jax.rl import stages
  from agentfly_jax.rl.spec import RunSpec

  rng = np.random.default_rng(11)
  rewards = [[0.0, 0.0, 0.0], list(rng.random(3).round(3)), [0.0, 0.0, 0.0]]
  trajs = _trajs(rng, rewards)
  for i, t in enumerate(trajs):
    t.finish_reason = "max_tokens_per_turn" if i in (1, 4) else "finish_tool"
    t.reward_metrics = {"success": float(t.reward > 0.5)}
  trajs.append(Trajectory(np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(0, np.float32), group_id=3))  # no row
  pen = float(rng.uniform(0.2, 1.5))
  arrays, metrics = stages.prepare(trajs, pad_id=0, dynamic_sampling=True, cut_turn_penalty=pen)
  flat = [r for g in rewards for r in g]
  want = [flat[i] - pen * (i in (1, 4)) for i in range(6)]  # group 2: all 0 and none cut: dropped
  np.testing.assert_allclose(arrays["rewards"], want, rtol=1e-6)
  assert metrics["dapo/groups_dropped"] == 1  # (group 3's only chain has no tokens: no row, no group)
  assert metrics["rollout/reward_mean"] == pytest.approx(np.mean(flat + [0.0]))  # logged: the rollout's rewards
  on_metric, _ = stages.prepare(trajs, pad_id=0, dynamic_sampling=False, score_metric="success", cut_turn_penalty=pen)
  np.testing.assert_allclose(
    on_metric["rewards"], [float(r > 0.5) - pen * (i in (1, 4)) for i, r in enumerate(flat)], rtol=1e-6
  )
  assert len(on_metric["rewards"]) == 9
  plain, _ = stages.prepare(trajs, pad_id=0, dynamic_sampling=False)
  np.testing.assert_allclose(plain["rewards"], flat, rtol=1e-6)  # 0: off
  c = _config(None)
  c.dapo.cut_turn_penalty = -0.5
  with pytest.raises(ValueError, match=r"config\.dapo\.cut_turn_penalty=-0\.5: must be a number >= 0"):
    RunSpec.from_config(c)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_skipping_with_the_batch_mean_is_the_unskipped_step(trainer, agg):
  """`train.skip_keeps_batch_mean`: the tied groups' rows still skip the forward and backward, but
  count in the loss's denominator, so loss, gradient and update equal the unskipped step's (the
  plain skip's gradient is larger by the denominators' ratio)."""
  rng = np.random.default_rng([5, len(agg)])
  rewards = [[0.5, 0.5, 0.5, 0.5], list(rng.random(4).round(3)), [0.2, 0.2, 0.2, 0.2], list(rng.random(4).round(3))]
  arrays = train_arrays(_trajs(rng, rewards), pad_id=0, length=48)
  loss_cfg = dataclasses.replace(trainer.run.loss_cfg, agg=agg)
  spec = trainer.spec
  init = jax.device_get(jax.tree.leaves(trainer.run.parts.policy.params))
  got, delta = {}, {}
  variants = {
    "plain": {},
    "keep": {"skip_zero_adv_rows": True, "skip_keeps_batch_mean": True},
    "absent": {"skip_zero_adv_rows": True},
  }
  for name, train in variants.items():
    s = dataclasses.replace(spec, train=dataclasses.replace(spec.train, **train))
    parts = ModelParts(trainer.run.parts.policy.graphdef, trainer.run.parts.policy.rest, trainer.run.optimizer)
    upd = PolicyUpdate(parts, s, loss_cfg, s.algorithm.estimator, trainer.run.parts.mesh, trainer.run.states.sharding)
    new, m = upd(trainer.new_state(trainer.run.parts.policy.params), None, arrays, step=1)
    got[name] = m.fetch()
    delta[name] = np.concatenate([(a - b).ravel() for a, b in zip(jax.device_get(jax.tree.leaves(new.params)), init)])
  assert got["keep"]["train/rows_trained"] == 8 and got["plain"]["train/rows_trained"] == 16
  for k in ("actor/grad_norm", "actor/loss_denom"):  # (actor/pg_loss: a mean of per-micro-batch ratios)
    assert got["keep"][k] == pytest.approx(got["plain"][k], rel=1e-5, abs=1e-7), k
  ratio = got["plain"]["actor/loss_denom"] / got["absent"]["actor/loss_denom"]
  assert ratio > 1.5  # the tied rows' share of the denominator
  assert got["absent"]["actor/grad_norm"] == pytest.approx(ratio * got["plain"]["actor/grad_norm"], rel=1e-4)
  # the update (Adam's first step, ~lr * sign(gradient)) equals the unskipped one up to float rounding
  assert np.abs(delta["plain"]).max() > 0
  assert np.linalg.norm(delta["keep"] - delta["plain"]) < 1e-2 * np.linalg.norm(delta["plain"])


def test_the_batch_mean_skip_refuses_packed_rows(trainer):
  spec = trainer.spec
  train = dict(skip_zero_adv_rows=True, skip_keeps_batch_mean=True, pack_sequences=True)
  s = dataclasses.replace(spec, train=dataclasses.replace(spec.train, **train))
  parts = ModelParts(trainer.run.parts.policy.graphdef, trainer.run.parts.policy.rest, trainer.run.optimizer)
  with pytest.raises(ValueError, match=r"config\.train\.skip_keeps_batch_mean=True: not with train\.pack_sequences"):
    PolicyUpdate(
      parts, s, trainer.run.loss_cfg, s.algorithm.estimator, trainer.run.parts.mesh, trainer.run.states.sharding
    )
