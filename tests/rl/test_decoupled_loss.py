"""Decoupled PPO (AReaL) vs a float64 numpy reference: value and gradient per token, the
truncated behaviour weight, and equality with plain PPO when behaviour == proximal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_losses import random_inputs, ref_ppo_token

from agentfly_jax.rl.core import losses as L


@pytest.mark.parametrize("cap", [1.5, 4.0])
def test_decoupled_ppo_matches_reference(cap):
  rng = np.random.default_rng(int(cap * 10))
  b, t = 5, 9
  lp, prox, adv, mask = random_inputs(rng, b, t)
  behav = prox + rng.normal(size=(b, t)) * 0.8  # several versions old: far from proximal
  fn = L.get_policy_loss("decoupled_ppo")

  def mean_loss(x):
    s, d, m = fn(
      x,
      jnp.asarray(prox),
      jnp.asarray(adv),
      jnp.asarray(mask),
      behaviour_logprobs=jnp.asarray(behav),
      behaviour_cap=cap,
      clip_low=0.2,
      clip_high=0.28,
      dual_clip=3.0,
    )
    return s / d, m

  (value, metrics), grad = jax.value_and_grad(mean_loss, has_aux=True)(jnp.asarray(lp, jnp.float32))
  n = mask.sum()
  ref_v, ref_g, ws = 0.0, np.zeros((b, t)), []
  for i in range(b):
    for j in range(t):
      if not mask[i, j]:
        continue
      w = min(np.exp(prox[i, j] - behav[i, j]), cap)
      ws.append(w)
      l, g = ref_ppo_token(lp[i, j], prox[i, j], adv[i, j], 0.2, 0.28, 3.0)
      ref_v += w * l / n
      ref_g[i, j] = w * g / n
  assert float(value) == pytest.approx(ref_v, rel=1e-4, abs=1e-6)
  np.testing.assert_allclose(np.asarray(grad), ref_g, rtol=1e-4, atol=1e-6)
  assert float(metrics["behaviour_weight_mean"]) == pytest.approx(np.mean(ws), rel=1e-4)
  assert float(metrics["behaviour_capped_frac"]) == pytest.approx(np.mean(np.array(ws) >= cap), abs=1e-6)
  assert 0 < float(metrics["behaviour_capped_frac"]) < 1  # the cap was exercised both ways


def test_decoupled_ppo_is_ppo_when_behaviour_is_proximal():
  rng = np.random.default_rng(3)
  lp, prox, adv, mask = random_inputs(rng, 4, 7)
  args = tuple(jnp.asarray(x) for x in (lp, prox, adv, mask))
  s1, d1, _ = L.get_policy_loss("decoupled_ppo")(*args, behaviour_logprobs=args[1], agg="seq-mean-token-mean")
  s2, d2, _ = L.policy_loss(*args, agg="seq-mean-token-mean")
  assert float(s1 / d1) == pytest.approx(float(s2 / d2), rel=1e-6)
  with pytest.raises(ValueError, match="behaviour_cap"):
    L.decoupled_ppo_loss(*args, behaviour_logprobs=args[1], behaviour_cap=0.0)
