"""Chunked log-probs + entropy (custom VJP) equal the plain log-softmax formulation: values
against float64 numpy, gradients (hidden and weight, both weight layouts) against jax.grad of
the plain [N, V] formulation, on random inputs; and the train step's loss/grads with and
without chunking agree."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from agentfly_jax.models.token_stats import chunked_logprobs_entropy


def _plain(h, w, tgt, temperature, vocab_major):
  logits = (h @ w.T if vocab_major else h @ w) / temperature
  logp = jax.nn.log_softmax(logits, axis=-1)
  lp = jnp.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]
  ent = -(jnp.exp(logp) * logp).sum(-1)
  return lp, ent


@pytest.mark.parametrize("vocab_major,temperature,chunk", [(True, 1.0, 5), (False, 0.7, 16), (True, 1.3, 64)])
def test_chunked_logprobs_entropy_values_and_grads_match_plain(vocab_major, temperature, chunk):
  rng = np.random.default_rng(chunk)
  B, T, D, V = 3, 7, 16, 50
  h = rng.normal(size=(B, T, D)).astype(np.float32)
  w = (rng.normal(size=(V, D) if vocab_major else (D, V)) * 0.5).astype(np.float32)
  tgt = rng.integers(0, V, (B, T)).astype(np.int32)
  lp, ent = chunked_logprobs_entropy(
    jnp.asarray(h),
    jnp.asarray(w),
    jnp.asarray(tgt),
    temperature=temperature,
    chunk=chunk,
    vocab_major=vocab_major,
    precision="highest",
  )
  logits = (h.astype(np.float64) @ (w.T if vocab_major else w).astype(np.float64)) / temperature
  logz = logits - logits.max(-1, keepdims=True)
  logp = logz - np.log(np.exp(logz).sum(-1, keepdims=True))
  np.testing.assert_allclose(lp, np.take_along_axis(logp, tgt[..., None], -1)[..., 0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ent, -(np.exp(logp) * logp).sum(-1), rtol=1e-5, atol=1e-5)

  a, b = rng.normal(size=(B, T)).astype(np.float32), rng.normal(size=(B, T)).astype(np.float32)

  def objective(fn):
    def f(h, w):
      lp, ent = fn(h, w)
      return (lp * a).sum() + (ent * b).sum()

    return jax.jit(jax.grad(f, argnums=(0, 1)))

  got = objective(
    lambda h, w: chunked_logprobs_entropy(
      h, w, jnp.asarray(tgt), temperature=temperature, chunk=chunk, vocab_major=vocab_major, precision="highest"
    )
  )(h, w)
  want = objective(lambda h, w: _plain(h, w, jnp.asarray(tgt), temperature, vocab_major))(h, w)
  for g, e in zip(got, want):
    assert np.abs(e).max() > 1e-3
    np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)


def test_chunked_logprobs_entropy_rejects_bad_arguments():
  h, w = jnp.ones((2, 3, 4)), jnp.ones((5, 4))
  with pytest.raises(ValueError, match="targets shape"):
    chunked_logprobs_entropy(h, w, jnp.zeros((2, 4), jnp.int32))
  with pytest.raises(ValueError, match="temperature"):
    chunked_logprobs_entropy(h, w, jnp.zeros((2, 3), jnp.int32), temperature=0.0)


@pytest.mark.parametrize(
  "counts, width", [((16, 5, 0, 11), 16), ((7, 8, 3, 0), 8), ((16, 17, 3, 0), 32), ((33, 2, 0, 1), 40)]
)
def test_at_loss_positions_equals_the_masked_full_computation(counts, width):
  """Log-probs/entropy only at loss positions, gathered per row into the smallest slot count of
  capacity (0.2, 0.4, 0.8) x L = 40 (8, 16 or 32 slots) that holds every row's, else all 40,
  equal the full [B, L] computation masked: values, and gradients in hidden and weight. Which
  route ran is read off a shape-dependent term the test adds (the width fn was called with)."""
  from agentfly_jax.models.token_stats import at_loss_positions, loss_slots

  capacity = (0.8, 0.2, 0.4)  # any order
  rng = np.random.default_rng(sum(counts))
  B, L, D, V = 4, 40, 16, 50
  assert [loss_slots(L, f) for f in sorted(capacity)] == [8, 16, 32]
  h = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(V, D)) * 0.5, jnp.float32)
  tgt = jnp.asarray(rng.integers(0, V, (B, L)), jnp.int32)
  mask = np.zeros((B, L), bool)
  for r, n in enumerate(counts):  # scattered positions, like turns between tool observations
    mask[r, rng.choice(L, n, replace=False)] = True
  mask = jnp.asarray(mask)
  a, b = jnp.asarray(rng.normal(size=(B, L)), jnp.float32), jnp.asarray(rng.normal(size=(B, L)), jnp.float32)

  def stats(hh, tt, ww):
    return chunked_logprobs_entropy(hh, ww, tt, chunk=8, precision="highest")

  def objective(route):
    def f(hh, ww):
      lp, ent = route(hh, ww)
      return (lp * a).sum() + (ent * b).sum(), (lp, ent)

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(h, w)

  def full(hh, ww):
    lp, ent = stats(hh, tgt, ww)
    return jnp.where(mask, lp, 0.0), jnp.where(mask, ent, 0.0)

  (v0, (lp0, ent0)), g0 = objective(full)
  (v1, (lp1, ent1)), g1 = objective(
    lambda hh, ww: at_loss_positions(lambda x, t: stats(x, t, ww), hh, tgt, mask, capacity)
  )
  np.testing.assert_allclose(np.asarray(lp1), np.asarray(lp0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ent1), np.asarray(ent0), rtol=1e-5, atol=1e-5)
  assert not np.asarray(lp1)[~np.asarray(mask)].any()
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
  for x, y in zip(g1, g0):
    assert float(jnp.abs(y).max()) > 1e-3
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)

  probe = jax.jit(
    lambda hh: at_loss_positions(
      lambda x, t: (x.sum(-1), jnp.full(t.shape, float(t.shape[1]))), hh, tgt, mask, capacity
    )[1]
  )(h)
  assert set(np.unique(np.asarray(probe)[np.asarray(mask)])) == {float(width)}


def test_capacity_fractions_name_a_bad_value():
  from agentfly_jax.models.token_stats import capacity_fractions

  assert capacity_fractions((0.75, 0.25, 1.0, 0)) == (0.25, 0.75)
  assert capacity_fractions(0.5) == (0.5,)
  with pytest.raises(ValueError, match="1.5"):
    capacity_fractions((0.5, 1.5))


def test_float32_weight_under_bfloat16_hidden_gets_a_float32_gradient():
  """A float32 weight goes in as it is (cast to bfloat16 chunk by chunk inside): the log-probs and
  dW (summed over chunks in float32, returned in float32) match a float64 reference."""
  rng = np.random.default_rng(11)
  n, d, v = 40, 16, 97
  hidden = jnp.asarray(rng.normal(size=(n, d)), jnp.bfloat16)
  weight = jnp.asarray(rng.normal(size=(d, v)) * 0.3, jnp.float32)
  targets = jnp.asarray(rng.integers(0, v, size=(n,)), jnp.int32)
  g_lp = jnp.asarray(rng.normal(size=(n,)), jnp.float32)

  def loss(w):
    lp, _ = chunked_logprobs_entropy(hidden, w, targets, chunk=16, vocab_major=False)
    return jnp.sum(lp * g_lp)

  dw = jax.grad(loss)(weight)
  assert dw.dtype == jnp.float32
  h64 = np.asarray(hidden, np.float64)
  z = h64 @ np.asarray(weight.astype(jnp.bfloat16), np.float64)
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  dz = np.asarray(g_lp, np.float64)[:, None] * (np.eye(v)[np.asarray(targets)] - p)
  want = h64.T @ dz
  assert np.linalg.norm(np.asarray(dw, np.float64) - want) / np.linalg.norm(want) < 1e-2


@pytest.mark.parametrize("vocab_major", [True, False])
def test_suppressed_ids_leave_the_softmax_values_and_grads(vocab_major):
  """`suppress` (a vision-language model's placeholder ids): values against float64 numpy of the softmax over the
  other tokens, gradients against jax.grad of the plain formulation with those columns removed; a target that is a
  suppressed id (an image token of the prompt: masked out of every loss) keeps a finite log-prob and no gradient."""
  rng = np.random.default_rng(7)
  B, T, D, V = 2, 9, 16, 40
  suppress = (3, 11, 12)
  keep = np.setdiff1d(np.arange(V), suppress)
  h = rng.normal(size=(B, T, D)).astype(np.float32)
  w = (rng.normal(size=(V, D) if vocab_major else (D, V)) * 0.5).astype(np.float32)
  tgt = rng.choice(keep, (B, T)).astype(np.int32)
  tgt[0, 0] = suppress[0]  # a placeholder target, weighted 0 below (a masked-out prompt position)
  a = rng.normal(size=(B, T)).astype(np.float32)
  a[0, 0] = 0.0
  b = rng.normal(size=(B, T)).astype(np.float32)
  run = lambda h, w: chunked_logprobs_entropy(  # noqa: E731
    h, w, jnp.asarray(tgt), temperature=0.8, chunk=4, vocab_major=vocab_major, precision="highest", suppress=suppress
  )
  lp, ent = run(jnp.asarray(h), jnp.asarray(w))
  logits = (h.astype(np.float64) @ (w.T if vocab_major else w).astype(np.float64))[..., keep] / 0.8
  logz = logits - logits.max(-1, keepdims=True)
  logp = logz - np.log(np.exp(logz).sum(-1, keepdims=True))
  index = np.searchsorted(keep, np.where(np.isin(tgt, keep), tgt, keep[0]))
  want_lp = np.take_along_axis(logp, index[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(lp)[1:], want_lp[1:], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(lp)[0, 1:], want_lp[0, 1:], rtol=1e-5, atol=1e-5)
  assert np.isfinite(float(lp[0, 0])) and float(lp[0, 0]) < -1e8  # probability 0, finite
  np.testing.assert_allclose(ent, -(np.exp(logp) * logp).sum(-1), rtol=1e-5, atol=1e-5)

  def plain_kept(h, w):
    w_kept = w[keep] if vocab_major else w[:, keep]
    lp, ent = _plain(
      h, w_kept, jnp.asarray(np.searchsorted(keep, np.where(np.isin(tgt, keep), tgt, keep[0]))), 0.8, vocab_major
    )
    return lp, ent

  def objective(fn):
    return jax.jit(jax.grad(lambda h, w: (fn(h, w)[0] * a).sum() + (fn(h, w)[1] * b).sum(), argnums=(0, 1)))

  got = objective(run)(h, w)
  want_h, want_w = objective(plain_kept)(h, w)  # the removed columns' gradient is 0 there
  np.testing.assert_allclose(got[0], want_h, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(got[1], want_w, rtol=2e-4, atol=2e-5)
  got_w = np.asarray(got[1]) if vocab_major else np.asarray(got[1]).T
  assert np.abs(got_w[keep]).max() > 1e-3 and np.all(got_w[list(suppress)] == 0.0)
