"""Losses vs. hand-derived float64 numpy references; gradients vs. analytic values."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentfly_jax.rl.core import losses as L

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

MODES = L.AGG_MODES


# --------------------------------------------------------------------------- references
def ref_aggregate(x, mask, mode, norm_len=None):
  b, t = x.shape
  rows = [bb for bb in range(b) if mask[bb].sum() > 0]
  tok_sum = sum(x[bb, tt] for bb in range(b) for tt in range(t) if mask[bb, tt])
  if mode == "token-mean":
    return tok_sum / max(mask.sum(), 1)
  if mode == "seq-mean-token-mean":
    per_seq = [sum(x[bb, tt] for tt in range(t) if mask[bb, tt]) / mask[bb].sum() for bb in rows]
    return sum(per_seq) / max(len(rows), 1)
  if mode == "seq-mean-token-sum":
    return tok_sum / max(len(rows), 1)
  return tok_sum / max(len(rows), 1) / (norm_len or t)


def ref_ppo_token(lp, old, a, cl, ch, c):
  """Per-token PPO loss and d loss / d lp, derived case by case."""
  d = lp - old
  clamped = abs(d) > 20
  r = np.exp(np.clip(d, -20, 20))
  if a > 0:  # max(-a r, -a clip(r)) = -a min(r, 1 + ch)
    if r < 1 + ch:
      return -a * r, (0.0 if clamped else -a * r)
    return -a * (1 + ch), 0.0
  if a < 0:  # |a| max(r, 1 - cl), then capped at |a| c
    if c is not None and r > c:
      return -a * c, 0.0
    if r > 1 - cl:
      return -a * r, (0.0 if clamped else -a * r)
    return -a * (1 - cl), 0.0
  return 0.0, 0.0


def random_inputs(rng, b, t, spread=0.4):
  lp = -rng.random((b, t)) * 3
  old = lp + rng.normal(size=(b, t)) * spread
  adv = rng.normal(size=(b, t))
  mask = rng.random((b, t)) < 0.7
  mask[rng.integers(0, b)] = False  # an all-masked row
  return lp, old, adv, mask


def loss_mean(fn, *args, **kw):
  s, d, _ = fn(*args, **kw)
  return s / d


# --------------------------------------------------------------------------- aggregate
@pytest.mark.parametrize("mode", MODES)
def test_aggregate_matches_reference(mode):
  rng = np.random.default_rng(10 + MODES.index(mode))
  x = rng.normal(size=(7, 9))
  mask = rng.random((7, 9)) < 0.5
  mask[3] = False
  x[~mask] = np.nan  # masked garbage must not leak
  s, d = jax.jit(functools.partial(L.aggregate, mode=mode))(x, mask)
  np.testing.assert_allclose(float(s / d), ref_aggregate(x, mask, mode), rtol=1e-5)
  np.testing.assert_allclose(float(d), float(L.denominator(mask, mode)))
  if mode == "seq-mean-token-sum-norm":
    s, d = jax.jit(functools.partial(L.aggregate, mode=mode, norm_len=64))(x, mask)
    np.testing.assert_allclose(float(s / d), ref_aggregate(x, mask, mode, 64), rtol=1e-5)


def test_all_masked_batch_gives_zero_not_nan():
  for mode in MODES:
    s, d = jax.jit(functools.partial(L.aggregate, mode=mode))(np.ones((2, 3)), np.zeros((2, 3)))
    assert float(d) == 0 and float(L.global_mean(s, d)) == 0


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_accumulation_equals_full_batch(mode):
  """4 micro-batches of 3 shuffled rows (one holds an all-masked row) vs. the 12-row batch:
  sum of loss_sum / sum of denom equals the full mean, and summed gradients of
  loss_sum_k / global_denom equal the full-batch gradient."""
  rng = np.random.default_rng(20 + MODES.index(mode))
  b, t, micro = 12, 8, 3
  lp, old, adv, mask = random_inputs(rng, b, t, spread=0.3)
  vals, old_vals, rets = rng.normal(size=(3, b, t))
  parts = np.split(rng.permutation(b), b // micro)

  for fn, args in (
    (L.policy_loss, (lp, old, adv, mask)),
    (L.gspo_policy_loss, (lp, old, adv, mask)),
    (L.value_loss, (vals, old_vals, rets, mask)),
  ):
    args = tuple(jnp.asarray(x, jnp.float32) for x in args)

    @jax.jit
    def sum_and_grad(*a, fn=fn):
      (s, d), g = jax.value_and_grad(lambda x: fn(x, *a[1:], agg=mode)[:2], has_aux=True)(a[0])
      return s, d, g

    full_s, full_d, full_g = sum_and_grad(*args)
    outs = [sum_and_grad(*[x[p] for x in args]) for p in parts]
    total_d = sum(d for _, d, _ in outs)
    np.testing.assert_allclose(float(total_d), float(full_d), rtol=1e-6)
    np.testing.assert_allclose(
      float(sum(s for s, _, _ in outs) / total_d), float(full_s / full_d), rtol=1e-5, atol=1e-7
    )
    acc_g = np.zeros((b, t))
    for p, (_, _, g) in zip(parts, outs):
      acc_g[p] += np.asarray(g) / float(total_d)
    np.testing.assert_allclose(acc_g, np.asarray(full_g) / float(full_d), rtol=1e-4, atol=1e-7)
    assert np.abs(acc_g).max() > 0
  np.testing.assert_allclose(sum(float(L.denominator(mask[p], mode)) for p in parts), float(L.denominator(mask, mode)))


# --------------------------------------------------------------------------- PPO
@pytest.mark.parametrize("cl, ch, c", [(0.2, 0.2, 3.0), (0.2, 0.28, 3.0), (0.1, 0.3, None)])
def test_ppo_value_gradient_and_metrics_match_reference(cl, ch, c):
  rng = np.random.default_rng(int(ch * 100) + (c is None))
  b, t = 6, 10
  lp, old, adv, mask = random_inputs(rng, b, t, spread=0.6)
  lp[0, :3] = old[0, :3] + np.array([25.0, -30.0, 1.5])  # beyond the +-20 clamp / dual-clip
  adv[0, :3] = [-1.0, 2.0, -1.3]
  mask[0, :3] = True
  f = jax.jit(functools.partial(L.policy_loss, clip_low=cl, clip_high=ch, dual_clip=c))
  s, d, m = f(lp, old, adv, mask)
  ref = np.zeros((b, t))
  grad = np.zeros((b, t))
  for i in range(b):
    for j in range(t):
      ref[i, j], grad[i, j] = ref_ppo_token(lp[i, j], old[i, j], adv[i, j], cl, ch, c)
  np.testing.assert_allclose(float(s / d), ref_aggregate(ref, mask, "token-mean"), rtol=1e-5)
  g = jax.jit(jax.grad(lambda x: loss_mean(f, x, old, adv, mask)))(jnp.asarray(lp, jnp.float32))
  np.testing.assert_allclose(g, grad * mask / mask.sum(), rtol=1e-4, atol=1e-7)
  r = np.exp(np.clip(lp - old, -20, 20))
  mm = mask.astype(bool)
  np.testing.assert_allclose(float(m["clipfrac_high"]), np.mean(((adv > 0) & (r > 1 + ch))[mm]), atol=1e-6)
  np.testing.assert_allclose(float(m["clipfrac_low"]), np.mean(((adv < 0) & (r < 1 - cl))[mm]), atol=1e-6)
  dual = (adv < 0) & (r > c) if c is not None else np.zeros_like(mm)
  np.testing.assert_allclose(float(m["dual_clip_frac"]), np.mean(dual[mm]), atol=1e-6)
  if c is not None:
    assert float(m["dual_clip_frac"]) > 0
  np.testing.assert_allclose(float(m["ratio_mean"]), np.mean(r[mm]), rtol=1e-5)
  k3 = np.exp(np.clip(old - lp, -20, 20)) - np.clip(old - lp, -20, 20) - 1
  np.testing.assert_allclose(float(m["approx_kl"]), np.mean(np.clip(k3, -10, 10)[mm]), rtol=1e-5)
  np.testing.assert_allclose(
    float(m["ppo_kl"]), np.mean(np.clip(old - lp, -20, 20)[mm]), rtol=1e-5, atol=1e-6
  )  # on the clamped log-ratio, as verl


def test_ppo_clamp_and_dual_clip_hand_values():
  old = np.zeros((1, 4))
  lp = np.array([[25.0, -25.0, np.log(5.0), np.log(5.0)]])
  adv = np.array([[-1.0, 2.0, -1.0, 1.0]])
  f = jax.jit(functools.partial(L.policy_loss, clip_high=0.2))  # symmetric clip (the default is DAPO's 0.28)
  per_token = [f(lp[:, k : k + 1], old[:, k : k + 1], adv[:, k : k + 1], np.ones((1, 1)))[0] for k in range(4)]
  # e^25 -> clamped to e^20 -> dual-clip caps at 3; e^-25 -> e^-20 (unclipped branch, A > 0);
  # ratio 5, A < 0 -> 3 (dual); ratio 5, A > 0 -> -1.2 (clip-high)
  np.testing.assert_allclose(np.array(per_token), [3.0, -2 * np.exp(-20.0), 3.0, -1.2], rtol=1e-5)


def test_ppo_importance_weights_scale_the_loss_and_get_no_gradient():
  rng = np.random.default_rng(30)
  lp, old, adv, mask = random_inputs(rng, 4, 6)
  w = rng.random((4, 6)) * 2
  ref = np.array(
    [[ref_ppo_token(lp[i, j], old[i, j], adv[i, j], 0.2, 0.2, 3.0)[0] for j in range(6)] for i in range(4)]
  )
  f = jax.jit(functools.partial(L.policy_loss, clip_high=0.2, agg="seq-mean-token-mean"))
  s, d, _ = f(lp, old, adv, mask, is_weights=w)
  np.testing.assert_allclose(float(s / d), ref_aggregate(ref * w, mask, "seq-mean-token-mean"), rtol=1e-5)
  gw = jax.jit(jax.grad(lambda x: f(lp, old, adv, mask, is_weights=x)[0]))(jnp.asarray(w))
  assert np.all(np.asarray(gw) == 0)


# --------------------------------------------------------------------------- GSPO
def test_gspo_matches_verl_definition_value_and_gradient():
  rng = np.random.default_rng(31)
  b, t = 5, 9
  lp, old, _, mask = random_inputs(rng, b, t, spread=0.002)
  adv = np.repeat(rng.normal(size=(b, 1)), t, axis=1)  # sequence-level advantages
  cl, ch = 3e-4, 4e-4
  f = jax.jit(functools.partial(L.gspo_policy_loss, clip_low=cl, clip_high=ch))
  s, d, m = f(lp, old, adv, mask)
  per_token, grad = np.zeros((b, t)), np.zeros((b, t))
  rows = [i for i in range(b) if mask[i].sum()]
  ratios = []
  for i in rows:
    n = mask[i].sum()
    s_i = np.exp(sum(lp[i, j] - old[i, j] for j in range(t) if mask[i, j]) / n)
    ratios.append(s_i)
    for j in range(t):
      a = adv[i, j]
      unclipped = (a > 0 and s_i < 1 + ch) or (a < 0 and s_i > 1 - cl)
      per_token[i, j] = -a * (s_i if unclipped else np.clip(s_i, 1 - cl, 1 + ch))
      grad[i, j] = (-a * s_i if unclipped else 0.0) * mask[i, j] / n / len(rows)
  np.testing.assert_allclose(float(s / d), ref_aggregate(per_token, mask, "seq-mean-token-mean"), rtol=1e-5)
  assert 0 < float(m["clipfrac"]) < 1  # both branches occur in this draw
  g = jax.jit(jax.grad(lambda x: loss_mean(f, x, old, adv, mask)))(jnp.asarray(lp, jnp.float32))
  np.testing.assert_allclose(g, grad, rtol=1e-4, atol=1e-7)


def test_gspo_optional_dual_clip_caps_negative_advantage_rows():
  # row 0: sequence ratio e^{ln 5} = 5 with A < 0; row 1: same ratio, A > 0
  lp = np.log(np.array([[5.0, 5.0], [5.0, 5.0]]))
  old = np.zeros((2, 2))
  adv = np.array([[-2.0, -2.0], [1.0, 1.0]])
  mask = np.ones((2, 2))
  f = jax.jit(L.gspo_policy_loss, static_argnames=("agg", "dual_clip"))
  s, d, m = f(lp, old, adv, mask, dual_clip=3.0, agg="token-mean")
  np.testing.assert_allclose(float(s / d), (2 * 3.0 * 2 + 2 * -(1 + 4e-4)) / 4, rtol=1e-5)
  np.testing.assert_allclose(float(m["dual_clip_frac"]), 0.5)
  for off in (None, 0):
    s, d, m = f(lp, old, adv, mask, dual_clip=off, agg="token-mean")
    np.testing.assert_allclose(float(s / d), (2 * 2 * 5.0 + 2 * -(1 + 4e-4)) / 4, rtol=1e-5)
    assert float(m["dual_clip_frac"]) == 0


# --------------------------------------------------------------------------- KL
@pytest.mark.parametrize("kind", L.KL_KINDS)
def test_kl_values_and_gradients(kind):
  rng = np.random.default_rng(40 + L.KL_KINDS.index(kind))
  lp = -rng.random((4, 7)) * 2
  ref = lp + rng.normal(size=(4, 7))
  ref[0, 0] = lp[0, 0] + 30.0  # beyond the k3 clamps
  d = lp - ref
  base = kind.rstrip("+")
  nd = np.clip(-d, -20, 20)
  k3 = np.exp(nd) - nd - 1
  value = {"k1": d, "k2": 0.5 * d * d, "k3": np.clip(k3, -10, 10)}[base]
  if kind.endswith("+"):
    grad = d  # straight-through: gradient of k2 whatever the forward estimator
  else:
    grad = {"k1": np.ones_like(d), "k2": d, "k3": np.where((np.abs(d) <= 20) & (np.abs(k3) < 10), 1 - np.exp(nd), 0.0)}[
      base
    ]
  f = jax.jit(functools.partial(L.kl_penalty, kind=kind))
  np.testing.assert_allclose(f(lp, ref), value, rtol=1e-5, atol=1e-6)
  g = jax.grad(lambda x: f(x, ref).sum())(jnp.asarray(lp, jnp.float32))
  np.testing.assert_allclose(g, grad, rtol=1e-4, atol=1e-5)
  # finite differences agree for the plain estimators (away from the clamps)
  if not kind.endswith("+"):
    eps = 1e-5
    lp64 = lp[1:].astype(np.float64)
    with jax.enable_x64(True):
      ref64 = jnp.asarray(ref[1:])
      fd = (
        np.asarray(L.kl_penalty(jnp.asarray(lp64 + eps), ref64, kind))
        - np.asarray(L.kl_penalty(jnp.asarray(lp64 - eps), ref64, kind))
      ) / (2 * eps)
    np.testing.assert_allclose(fd, grad[1:], rtol=1e-4, atol=1e-6)


def test_kl_loss_aggregates_the_penalty():
  rng = np.random.default_rng(45)
  lp, ref, _, mask = random_inputs(rng, 5, 6)
  f = jax.jit(functools.partial(L.kl_loss, kind="k3+", agg="seq-mean-token-mean"))
  s, d, m = f(lp, ref, mask)
  nd = np.clip(ref - lp, -20, 20)
  k3 = np.clip(np.exp(nd) - nd - 1, -10, 10)
  np.testing.assert_allclose(float(s / d), ref_aggregate(k3, mask, "seq-mean-token-mean"), rtol=1e-5)
  np.testing.assert_allclose(float(m["kl"]), k3[mask].mean(), rtol=1e-5)


# --------------------------------------------------------------------------- value loss
@pytest.mark.parametrize("clip", [0.5, 0.1, None])
def test_value_loss_value_gradient_and_clipfrac(clip):
  rng = np.random.default_rng(50 + int((clip or 0) * 10))
  v, old, ret = rng.normal(size=(3, 6, 8))
  mask = rng.random((6, 8)) < 0.7
  per_token, grad, clipped = np.zeros((6, 8)), np.zeros((6, 8)), np.zeros((6, 8), bool)
  for i in range(6):
    for j in range(8):
      l1 = (v[i, j] - ret[i, j]) ** 2
      if clip is None:
        per_token[i, j], grad[i, j] = 0.5 * l1, v[i, j] - ret[i, j]
        continue
      vc = min(max(v[i, j], old[i, j] - clip), old[i, j] + clip)
      l2 = (vc - ret[i, j]) ** 2
      clipped[i, j] = l2 > l1 and abs(v[i, j] - old[i, j]) > clip
      per_token[i, j] = 0.5 * max(l1, l2)
      grad[i, j] = 0.0 if l2 > l1 else v[i, j] - ret[i, j]
  f = jax.jit(functools.partial(L.value_loss, clip=clip))
  s, d, m = f(v, old, ret, mask)
  np.testing.assert_allclose(float(s / d), ref_aggregate(per_token, mask, "token-mean"), rtol=1e-5)
  np.testing.assert_allclose(float(m["vf_clipfrac"]), clipped[mask].mean(), atol=1e-6)
  if clip == 0.1:
    assert float(m["vf_clipfrac"]) > 0
  g = jax.grad(lambda x: loss_mean(f, x, old, ret, mask))(jnp.asarray(v, jnp.float32))
  np.testing.assert_allclose(g, grad * mask / mask.sum(), rtol=1e-4, atol=1e-7)


def test_value_loss_ties_are_not_clips():
  """V == V_old (a step's first minibatch) or V within rounding of it: the clip changes nothing, so
  vf_clipfrac is 0 whichever of the two equal branches rounding makes larger; a real clip counts."""
  rng = np.random.default_rng(7)
  v = rng.normal(size=(4, 16)).astype(np.float32)
  ret = rng.normal(size=(4, 16)).astype(np.float32)
  mask = np.ones((4, 16), bool)
  near = v + rng.choice([-1, 1], size=v.shape) * np.spacing(v) * rng.integers(0, 4, size=v.shape)
  for old in (v, near):
    _, _, m = L.value_loss(v, old, ret, mask, clip=0.2)
    assert float(m["vf_clipfrac"]) == 0.0
  far = v + np.where(ret > v, -1.0, 1.0).astype(np.float32)  # old 1 away, on the side away from R
  _, _, m = L.value_loss(v, far, ret, mask, clip=0.2)
  assert float(m["vf_clipfrac"]) == 1.0


# --------------------------------------------------------------------------- from logits
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_and_entropy_match_numpy(temperature):
  rng = np.random.default_rng(60 + int(temperature * 10))
  logits = rng.normal(size=(3, 5, 11)) * 3
  targets = rng.integers(0, 11, size=(3, 5))
  z = logits / temperature
  logp = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
  expect = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  f = jax.jit(functools.partial(L.token_logprobs, temperature=temperature))
  np.testing.assert_allclose(f(logits, targets), expect, atol=1e-5)
  ent = -(np.exp(logp) * logp).sum(-1)
  np.testing.assert_allclose(
    jax.jit(functools.partial(L.entropy_from_logits, temperature=temperature))(logits), ent, atol=1e-5
  )
  # d logp[target] / d logits = (onehot - softmax) / temperature
  g = jax.grad(lambda x: f(x, targets).sum())(jnp.asarray(logits, jnp.float32))
  onehot = np.eye(11)[targets]
  np.testing.assert_allclose(g, (onehot - np.exp(logp)) / temperature, atol=1e-5)
  # bf16 logits are upcast: the result equals float32 maths on the bf16-rounded logits
  bf16 = jnp.asarray(logits, jnp.bfloat16)
  out = f(bf16, targets)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, f(np.asarray(bf16.astype(jnp.float32)), targets), atol=1e-5)


def test_token_logprobs_keeps_no_vocab_sized_temporary():
  logits = jax.ShapeDtypeStruct((2, 64, 4096), jnp.float32)
  targets = jax.ShapeDtypeStruct((2, 64), jnp.int32)
  full = 2 * 64 * 4096 * 4
  fwd = jax.jit(functools.partial(L.token_logprobs, temperature=0.7))
  bwd = jax.jit(jax.grad(lambda x, t: L.token_logprobs(x, t, 0.7).sum()))
  for f in (fwd, bwd):
    mem = f.lower(logits, targets).compile().memory_analysis()
    if mem is None:
      pytest.skip("no memory analysis on this backend")
    assert mem.temp_size_in_bytes < full / 4


def test_entropy_ignores_minus_inf_logits():
  logits = np.array([[[0.0, -np.inf, 0.0, -np.inf]]], np.float32)
  np.testing.assert_allclose(jax.jit(L.entropy_from_logits)(logits), [[np.log(2.0)]], rtol=1e-6)


# --------------------------------------------------------------------------- errors
def test_errors_name_the_problem():
  x = np.zeros((2, 3))
  with pytest.raises(ValueError, match="unknown policy loss 'grpo'.*ppo.*gspo"):
    L.get_policy_loss("grpo")
  assert L.get_policy_loss("ppo") is L.policy_loss
  assert L.get_policy_loss("gspo") is L.gspo_policy_loss
  with pytest.raises(ValueError, match="aggregation mode 'mean'.*token-mean"):
    L.aggregate(x, x, "mean")
  with pytest.raises(ValueError, match="KL kind 'k4'"):
    L.kl_penalty(x, x, "k4")
  with pytest.raises(ValueError, match="advantages"):
    L.policy_loss(x, x, np.zeros((2, 4)), x)
  with pytest.raises(ValueError, match="mask"):
    L.policy_loss(x, x, x, np.ones((3, 3)))
  with pytest.raises(ValueError, match="logprobs.*rank 2"):
    L.policy_loss(np.zeros(3), np.zeros(3), np.zeros(3), np.ones(3))
  with pytest.raises(ValueError, match="is_weights"):
    L.policy_loss(x, x, x, x, is_weights=np.ones(2))
  with pytest.raises(ValueError, match="dual_clip must be > 1"):
    L.policy_loss(x, x, x, x, dual_clip=0.9)
  with pytest.raises(ValueError, match="dual_clip must be > 1"):
    L.gspo_policy_loss(x, x, x, x, dual_clip=1.0)
  with pytest.raises(ValueError, match="returns"):
    L.value_loss(x, x, np.zeros((1, 3)), x)
  with pytest.raises(ValueError, match="temperature"):
    L.token_logprobs(np.zeros((2, 3, 4)), np.zeros((2, 3), np.int32), temperature=0.0)
  with pytest.raises(ValueError, match="targets.*integers"):
    L.token_logprobs(np.zeros((2, 3, 4)), np.zeros((2, 3)))
  with pytest.raises(ValueError, match="logits.*rank 3"):
    L.entropy_from_logits(np.zeros((2, 3)))
  with pytest.raises(ValueError, match="norm_len"):
    L.aggregate(x, x, "seq-mean-token-sum-norm", norm_len=0)
