"""Advantage estimators vs. hand-derived float64 numpy references (loops over rows and tokens)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentfly_jax.rl.core import advantages as A

ATOL = 2e-5


# --------------------------------------------------------------------------- references
def ref_group_members(gids):
  return {g: [j for j in range(len(gids)) if gids[j] == g] for g in set(gids.tolist())}


def ref_grpo(scores, gids, norm_by_std=True, eps=1e-6):
  groups = ref_group_members(gids)
  out = np.zeros(len(scores))
  for i in range(len(scores)):
    xs = [float(scores[j]) for j in groups[gids[i]]]
    if len(xs) == 1:
      mean, std = 0.0, 1.0
    else:
      mean = sum(xs) / len(xs)
      std = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
  return out


def ref_rloo(scores, gids):
  groups = ref_group_members(gids)
  out = np.zeros(len(scores))
  for i in range(len(scores)):
    others = [float(scores[j]) for j in groups[gids[i]] if j != i]
    out[i] = scores[i] - sum(others) / len(others) if others else scores[i]
  return out


def ref_whiten(x, mask, eps=1e-8):
  vals = [x[b, t] for b in range(x.shape[0]) for t in range(x.shape[1]) if mask[b, t]]
  n = len(vals)
  mean = sum(vals) / n if n else 0.0
  var = sum((u - mean) ** 2 for u in vals) / (n - 1) if n > 1 else 0.0
  out = np.zeros(x.shape)
  for b in range(x.shape[0]):
    for t in range(x.shape[1]):
      if mask[b, t]:
        out[b, t] = (x[b, t] - mean) / np.sqrt(var + eps)
  return out


def ref_action_steps(r_row, m_row):
  """Action positions and their reward incl. rewards on the masked tokens that follow them."""
  pos = [t for t in range(len(m_row)) if m_row[t]]
  rew = []
  for k, t in enumerate(pos):
    end = pos[k + 1] if k + 1 < len(pos) else len(m_row)
    rew.append(sum(r_row[u] for u in range(t, end)))
  return pos, rew


def ref_returns(r, mask, gamma):
  out = np.zeros(r.shape)
  for b in range(r.shape[0]):
    pos, rew = ref_action_steps(r[b], mask[b])
    g = 0.0
    for k in reversed(range(len(pos))):
      g = rew[k] + gamma * g
      out[b, pos[k]] = g
  return out


def ref_gae(r, values, mask, gamma, lam):
  adv, ret = np.zeros(r.shape), np.zeros(r.shape)
  for b in range(r.shape[0]):
    pos, rew = ref_action_steps(r[b], mask[b])
    a_next = 0.0
    for k in reversed(range(len(pos))):
      v_next = values[b, pos[k + 1]] if k + 1 < len(pos) else 0.0
      delta = rew[k] + gamma * v_next - values[b, pos[k]]
      a_next = delta + gamma * lam * a_next
      adv[b, pos[k]] = a_next
      ret[b, pos[k]] = a_next + values[b, pos[k]]
  return adv, ret


# --------------------------------------------------------------------------- inputs
def random_groups(rng, b):
  """Random group ids (arbitrary, some negative), sizes 1..5 incl. singletons, shuffled."""
  ids, g = [], 0
  while len(ids) < b:
    ids += [int(rng.integers(-(10**6), 10**6)) + g] * int(rng.integers(1, 6))
    g += 1
  ids = np.array(ids[:b], np.int32)
  rng.shuffle(ids)
  return ids


def random_mask(rng, b, t, p=0.6):
  mask = rng.random((b, t)) < p
  mask[rng.integers(0, b)] = False  # an all-masked row
  return mask


@jax.jit
def outcome_estimators(scores, gids):
  return (A.grpo(scores, gids), A.drgrpo(scores, gids), A.grpo(scores, gids, norm_by_std=False), A.rloo(scores, gids))


def test_grpo_drgrpo_rloo_match_reference_on_random_groups():
  rng = np.random.default_rng(1)
  for b in (1, 7, 33):
    scores = rng.normal(size=b) * 3
    gids = random_groups(rng, b)
    grpo, drgrpo, grpo_mean_only, rloo = outcome_estimators(scores, gids)
    np.testing.assert_allclose(grpo, ref_grpo(scores, gids), atol=1e-4)
    np.testing.assert_allclose(drgrpo, ref_grpo(scores, gids, norm_by_std=False), atol=ATOL)
    np.testing.assert_allclose(grpo_mean_only, ref_grpo(scores, gids, norm_by_std=False), atol=ATOL)
    np.testing.assert_allclose(rloo, ref_rloo(scores, gids), atol=ATOL)


def test_singleton_and_zero_variance_groups():
  scores = np.array([0.7, 0.1, 0.1, 0.1, 0.3, 0.3, -2.0], np.float32)
  gids = np.array([5, 9, 9, 9, 2, 2, 11], np.int32)
  grpo, drgrpo, _, rloo = (np.asarray(x) for x in outcome_estimators(scores, gids))
  # singletons: mean 0, std 1 (verl); constant groups: exactly 0, no 1e-8/eps blow-up
  np.testing.assert_allclose(grpo[[0, 6]], scores[[0, 6]] / (1 + 1e-6), rtol=1e-6)
  np.testing.assert_allclose(drgrpo[[0, 6]], scores[[0, 6]], rtol=1e-6)
  np.testing.assert_allclose(rloo[[0, 6]], scores[[0, 6]])
  for adv in (grpo, drgrpo, rloo):
    assert np.all(adv[1:6] == 0.0)


def test_group_ids_need_not_be_contiguous_or_sorted():
  rng = np.random.default_rng(2)
  scores = rng.normal(size=12)
  gids = np.repeat(np.array([40, -3, 7]), 4)
  perm = rng.permutation(12)
  a = np.asarray(outcome_estimators(scores, gids)[0])
  b = np.asarray(outcome_estimators(scores[perm], gids[perm])[0])
  np.testing.assert_allclose(a[perm], b, atol=1e-6)


def test_broadcast_and_scores_to_token_rewards():
  rng = np.random.default_rng(3)
  adv = rng.normal(size=5)
  mask = random_mask(rng, 5, 9)
  np.testing.assert_allclose(jax.jit(A.broadcast_to_tokens)(adv, mask), adv[:, None] * mask, atol=1e-6)
  r = np.asarray(jax.jit(A.scores_to_token_rewards)(adv, mask))
  for b in range(5):
    pos = np.flatnonzero(mask[b])
    expect = np.zeros(9)
    if len(pos):
      expect[pos[-1]] = adv[b]
    np.testing.assert_allclose(r[b], expect, atol=1e-6)


def test_masked_whiten_matches_reference_and_survives_degenerate_masks():
  rng = np.random.default_rng(4)
  x = rng.normal(size=(6, 11)) * 2 + 1
  mask = random_mask(rng, 6, 11)
  np.testing.assert_allclose(jax.jit(A.masked_whiten)(x, mask), ref_whiten(x, mask), atol=1e-4)
  whiten = jax.jit(A.masked_whiten)
  assert np.all(np.asarray(whiten(x, np.zeros((6, 11), bool))) == 0)
  one = np.zeros((6, 11), bool)
  one[2, 3] = True
  out = np.asarray(whiten(x, one))
  assert np.all(np.isfinite(out)) and np.all(out == 0)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_discounted_returns_and_reinforce_pp_match_reference(gamma):
  rng = np.random.default_rng(5 + int(gamma * 10))
  r = rng.normal(size=(7, 13)) * (rng.random((7, 13)) < 0.3)
  mask = random_mask(rng, 7, 13)
  returns = jax.jit(functools.partial(A.discounted_returns, gamma=gamma))(r, mask)
  np.testing.assert_allclose(returns, ref_returns(r, mask, gamma), atol=1e-5)
  if gamma == 1.0:  # AgentFly's no-reset recursion over every position, read at action tokens
    agentfly = np.zeros(r.shape)
    for b in range(r.shape[0]):
      running = 0.0
      for t in reversed(range(r.shape[1])):
        running = r[b, t] + gamma * running
        agentfly[b, t] = running * mask[b, t]
    np.testing.assert_allclose(returns, agentfly, atol=1e-5)
  adv = jax.jit(functools.partial(A.reinforce_pp, gamma=gamma))(r, mask)
  np.testing.assert_allclose(adv, ref_whiten(ref_returns(r, mask, gamma), mask), atol=1e-4)


def test_multi_turn_returns_carry_outcome_across_observation():
  # one row: prompt(2) turn1(3) observation(4) turn2(2) pad(1); outcome 1.0 on last action token
  mask = np.array([[0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0]], bool)
  r = np.zeros((1, 12))
  r[0, 10] = 1.0
  g = 0.5
  returns = jax.jit(A.discounted_returns, static_argnames="gamma")
  out = np.asarray(returns(r, mask, gamma=g))[0]
  # action steps: 2,3,4 | 9,10 -> G = g^4, g^3, g^2 | g, 1; the observation is not a step
  np.testing.assert_allclose(out[[2, 3, 4, 9, 10]], [g**4, g**3, g**2, g, 1.0], rtol=1e-6)
  assert np.all(out[[0, 1, 5, 6, 7, 8, 11]] == 0)
  # verl's reset would give turn 1 nothing; here gamma=1 gives every turn the outcome
  out1 = np.asarray(returns(r, mask, gamma=1.0))[0]
  np.testing.assert_allclose(out1[mask[0]], 1.0)
  # a tool reward on the observation segment is credited to turn 1's last token
  r[0, 6] = 0.25
  out2 = np.asarray(returns(r, mask, gamma=1.0))[0]
  np.testing.assert_allclose(out2[[2, 3, 4, 9, 10]], [1.25, 1.25, 1.25, 1.0, 1.0], rtol=1e-6)


def test_multi_turn_gae_bootstraps_from_next_turn():
  mask = np.array([[0, 1, 1, 0, 0, 0, 1, 1, 0]], bool)
  r = np.zeros((1, 9))
  r[0, 7] = 2.0
  vals = np.array([[9.0, 0.5, 0.2, 7.0, 7.0, 7.0, 0.3, 0.4, 9.0]])  # masked values never used
  g, lam = 0.9, 0.8
  adv, ret = jax.jit(functools.partial(A.gae, gamma=g, lam=lam, whiten=False))(r, vals, mask)
  adv, ret = np.asarray(adv)[0], np.asarray(ret)[0]
  d7 = 2.0 - 0.4
  d6 = g * 0.4 - 0.3
  d2 = g * 0.3 - 0.2  # the bootstrap crosses the observation to the next action token
  d1 = g * 0.2 - 0.5
  a7, a6 = d7, d6 + g * lam * d7
  a2 = d2 + g * lam * a6
  a1 = d1 + g * lam * a2
  np.testing.assert_allclose(adv[[1, 2, 6, 7]], [a1, a2, a6, a7], rtol=1e-5)
  np.testing.assert_allclose(ret[[1, 2, 6, 7]], np.array([a1, a2, a6, a7]) + vals[0, [1, 2, 6, 7]], rtol=1e-5)
  assert np.all(adv[~mask[0]] == 0) and np.all(ret[~mask[0]] == 0)


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.95, 0.9), (0.7, 0.0)])
def test_gae_matches_reference(gamma, lam):
  rng = np.random.default_rng(int(gamma * 100 + lam * 10))
  r = rng.normal(size=(6, 10)) * (rng.random((6, 10)) < 0.4)
  vals = rng.normal(size=(6, 10))
  mask = random_mask(rng, 6, 10)
  f = jax.jit(functools.partial(A.gae, gamma=gamma, lam=lam, whiten=False))
  adv, ret = f(r, vals, mask)
  ref_adv, ref_ret = ref_gae(r, vals, mask, gamma, lam)
  np.testing.assert_allclose(adv, ref_adv, atol=1e-5)
  np.testing.assert_allclose(ret, ref_ret, atol=1e-5)
  adv_w, ret_w = jax.jit(functools.partial(A.gae, gamma=gamma, lam=lam))(r, vals, mask)
  np.testing.assert_allclose(adv_w, ref_whiten(ref_adv, mask), atol=1e-4)
  np.testing.assert_allclose(ret_w, ref_ret, atol=1e-5)


def test_gae_with_zero_values_and_lambda_one_gives_the_discounted_returns():
  rng = np.random.default_rng(8)
  r = rng.normal(size=(5, 9))
  mask = random_mask(rng, 5, 9)

  @jax.jit
  def both(r, mask):
    return (A.gae(r, jnp.zeros_like(r), mask, gamma=0.8, lam=1.0)[1], A.discounted_returns(r, mask, gamma=0.8))

  gae_returns, returns = both(r, mask)
  np.testing.assert_allclose(gae_returns, returns, atol=1e-5)


def test_reinforce_pp_baseline_matches_reference():
  rng = np.random.default_rng(9)
  scores = rng.normal(size=10)
  gids = random_groups(rng, 10)
  mask = random_mask(rng, 10, 6)
  base = np.array([ref_grpo(scores, gids, norm_by_std=False)[i] for i in range(10)])
  expect = ref_whiten(base[:, None] * mask, mask, eps=1e-6)
  got = jax.jit(A.reinforce_pp_baseline)(scores, gids, mask)
  np.testing.assert_allclose(got, expect, atol=1e-4)


def test_registry_and_uniform_compute():
  assert set(A.names()) >= {"grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"}
  assert A.get("grpo") is A.grpo and A.get("gae") is A.gae
  rng = np.random.default_rng(10)
  b, t = 8, 7
  scores, gids, mask = rng.normal(size=b), random_groups(rng, b), random_mask(rng, b, t)
  vals = rng.normal(size=(b, t))

  @jax.jit
  def every_estimator(mask, scores, gids, vals):
    return {
      name: A.compute(name, mask=mask, scores=scores, group_ids=gids, values=vals, gamma=0.9, lam=0.95)
      for name in A.names()
    }

  out = every_estimator(mask, scores, gids, vals)
  for name, (adv, ret) in out.items():
    assert adv.shape == ret.shape == (b, t), name
    assert np.all(np.asarray(adv)[~mask] == 0), name
  np.testing.assert_allclose(out["grpo"][0], ref_grpo(scores, gids)[:, None] * mask, atol=1e-4)
  np.testing.assert_allclose(out["rloo"][0], ref_rloo(scores, gids)[:, None] * mask, atol=1e-5)
  token_r = np.zeros((b, t))
  for i in range(b):
    if mask[i].any():
      token_r[i, np.flatnonzero(mask[i])[-1]] = scores[i]
  ref_adv, ref_ret = ref_gae(token_r, vals, mask, 0.9, 0.95)
  np.testing.assert_allclose(out["gae"][1], ref_ret, atol=1e-5)
  np.testing.assert_allclose(out["gae"][0], ref_whiten(ref_adv, mask), atol=1e-4)
  np.testing.assert_allclose(out["reinforce_pp"][1], ref_returns(token_r, mask, 0.9), atol=1e-5)


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*grpo.*gae"):
    A.get("ppo")
  with pytest.raises(ValueError, match="group_ids"):
    A.grpo(np.zeros(4), np.zeros(5, np.int32))
  with pytest.raises(ValueError, match="group_ids.*integers"):
    A.rloo(np.zeros(4), np.zeros(4))
  with pytest.raises(ValueError, match="scores.*rank 1"):
    A.grpo(np.zeros((4, 2)), np.zeros(4, np.int32))
  with pytest.raises(ValueError, match="mask"):
    A.discounted_returns(np.zeros((3, 4)), np.ones((3, 5)))
  with pytest.raises(ValueError, match="values"):
    A.gae(np.zeros((3, 4)), np.zeros((3, 3)), np.ones((3, 4)))
  with pytest.raises(ValueError, match="mask"):
    A.broadcast_to_tokens(np.zeros(3), np.ones((4, 5)))
  with pytest.raises(ValueError, match="values"):
    A.compute("gae", mask=np.ones((2, 3)), scores=np.zeros(2))
  with pytest.raises(ValueError, match="already registered"):
    A.register("grpo", A.grpo, lambda **kw: None)
  with pytest.raises(ValueError, match="token_rewards"):
    jax.jit(A.reinforce_pp)(jnp.zeros((2, 3, 1)), jnp.ones((2, 3)))
