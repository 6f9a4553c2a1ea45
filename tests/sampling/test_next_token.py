"""The two-level inverse-CDF draw: right frequencies, never a zero-probability token."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentfly_jax.sampling.next_token import DRAW_BLOCK, draw_from_probs, sample_next_tokens

_draw = jax.jit(draw_from_probs)


def _frequencies(probs_row: np.ndarray, num_draws: int, seed: int) -> np.ndarray:
  probs = jnp.broadcast_to(jnp.asarray(probs_row, jnp.float32), (num_draws, probs_row.shape[0]))
  keys = jax.random.split(jax.random.key(seed), num_draws)
  tokens = np.asarray(_draw(probs, keys))
  return np.bincount(tokens, minlength=probs_row.shape[0]) / num_draws


@pytest.mark.parametrize("vocab", [7, DRAW_BLOCK, 3 * DRAW_BLOCK + 5])
def test_frequencies_match_the_probabilities(vocab):
  rng = np.random.default_rng(vocab)
  probs = rng.dirichlet(np.full(vocab, 0.3))
  probs[rng.random(vocab) < 0.3] = 0.0  # truncated tokens
  probs[rng.integers(vocab)] += 0.05
  probs /= probs.sum()
  n = 40_000
  freq = _frequencies(probs, n, seed=vocab)
  assert np.all(freq[probs == 0] == 0), "a zero-probability token was drawn"
  sigma = np.sqrt(probs * (1 - probs) / n)
  assert np.all(np.abs(freq - probs) <= 5 * sigma + 1e-4), np.max(np.abs(freq - probs) / (sigma + 1e-12))


def test_unnormalised_rows_and_mass_only_at_the_edges():
  vocab = 2 * DRAW_BLOCK + 3
  probs = np.zeros((3, vocab), np.float32)
  probs[0, -1] = 5.0  # all mass on the last token (in the padded last block)
  probs[1, 0] = 1e-30
  probs[1, -1] = 2.0  # a tiny mass first, the rest last
  probs[2, DRAW_BLOCK - 1] = 0.25
  probs[2, DRAW_BLOCK] = 0.25  # straddles a block boundary
  keys = jax.random.split(jax.random.key(0), 3 * 500).reshape(500, 3)
  tokens = np.stack([np.asarray(_draw(jnp.asarray(probs), k)) for k in keys[:50]])
  assert np.all(tokens[:, 0] == vocab - 1)
  assert np.all(tokens[:, 1] == vocab - 1)
  assert set(tokens[:, 2]) <= {DRAW_BLOCK - 1, DRAW_BLOCK} and len(set(tokens[:, 2])) == 2


def test_sample_next_tokens_draws_from_log_softmax_at_temperature():
  rng = np.random.default_rng(3)
  vocab, t = 50, 0.7
  logits = rng.normal(size=vocab).astype(np.float32) * 2
  n = 20_000
  tokens, logprobs = jax.jit(sample_next_tokens)(
    jnp.broadcast_to(jnp.asarray(logits), (n, vocab)),
    jnp.full((n,), t),
    jnp.zeros((n,), jnp.int32),
    jnp.ones((n,)),
    jax.random.split(jax.random.key(1), n),
  )
  expected = jax.nn.softmax(jnp.asarray(logits) / t)
  freq = np.bincount(np.asarray(tokens), minlength=vocab) / n
  sigma = np.sqrt(expected * (1 - expected) / n)
  assert np.all(np.abs(freq - expected) <= 5 * sigma + 1e-4)
  np.testing.assert_allclose(
    np.asarray(logprobs), np.log(np.asarray(expected))[np.asarray(tokens)], rtol=1e-5, atol=1e-5
  )
