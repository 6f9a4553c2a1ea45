"""Choosing the next token from logits: greedy, temperature, top-k, top-p. Pure jnp.

Log-prob convention (shared by the JAX and the vLLM sampler): the log-prob returned for a
sampled token is its log-probability under the distribution it was actually drawn from, i.e.

  greedy (temperature < 1e-5):  log_softmax(logits)[token]                     (temperature 1)
  sampled:                      log_softmax(truncate(logits / T))[token]

where `truncate` sets to -inf every token outside the top-k set and then outside the top-p
nucleus of the renormalised top-k distribution (top-k first, then top-p, as vLLM does). This is
vLLM's `logprobs_mode="processed_logprobs"`. With top_p == 1 and top_k == 0 (the usual RL
setting) it equals log_softmax(logits / T), what a trainer computes at temperature T.

Drawing uses the inverse CDF with one uniform number per row, in two levels (blocks of
`DRAW_BLOCK` tokens, then a token inside the chosen block), so a step costs O(V) simple work and
B random numbers. `jax.random.categorical` (Gumbel-max) needs V random numbers per row: with
threefry on CPU a sizeable share of a decode step (lab/results/cpu_code_paths/README.md).

Top-k keeps every token whose logit is >= the k-th largest (ties at the boundary are kept).
Top-p keeps a token iff the renormalised probability mass of the tokens ranked strictly above it
is < top_p (so the most likely token is always kept).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

GREEDY_TEMPERATURE = 1e-5  # temperatures below this mean greedy (vLLM's _SAMPLING_EPS)
DRAW_BLOCK = 256  # tokens per block of the two-level inverse-CDF draw


def truncation_mask(scaled_logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
  """Which tokens survive top-k then top-p.

  Args:
    scaled_logits: float32[B, V], logits already divided by the temperature.
    top_k: int32[B]; 0 = off (values >= V are off too).
    top_p: float32[B] in (0, 1]; 1 = off.
  Returns:
    bool[B, V], True = kept. At least one token per row is kept.
  """
  chex.assert_rank(scaled_logits, 2)
  vocab = scaled_logits.shape[-1]
  sorted_desc = -jnp.sort(-scaled_logits, axis=-1)  # float32[B, V]
  k = jnp.where((top_k <= 0) | (top_k > vocab), vocab, top_k)
  kth_value = jnp.take_along_axis(sorted_desc, (k - 1)[:, None], axis=-1)  # [B, 1]
  in_top_k_sorted = sorted_desc >= kth_value
  masked_sorted = jnp.where(in_top_k_sorted, sorted_desc, -jnp.inf)
  probs_sorted = jax.nn.softmax(masked_sorted, axis=-1)
  mass_above = jnp.cumsum(probs_sorted, axis=-1) - probs_sorted
  keep_sorted = in_top_k_sorted & (mass_above < top_p[:, None])
  keep_sorted = keep_sorted.at[:, 0].set(True)
  # The kept set is a prefix of the sorted order: a token is kept iff its logit is >= the
  # smallest kept logit (ties with it are kept too, as with top-k).
  num_kept = jnp.sum(keep_sorted, axis=-1)
  min_kept = jnp.take_along_axis(sorted_desc, (num_kept - 1)[:, None], axis=-1)
  return scaled_logits >= min_kept


def sample_next_tokens(
  logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, keys: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row and returns it with its log-prob (see the module docstring).

  Args:
    logits: float[B, V] raw next-token logits.
    temperature: float32[B]; < 1e-5 means greedy.
    top_k: int32[B]; 0 = off.
    top_p: float32[B]; 1 = off.
    keys: PRNG keys, one per row (uint32[B, 2] or a typed key array [B]).
  Returns:
    (tokens int32[B], logprobs float32[B]).
  """
  chex.assert_rank(logits, 2)
  batch = logits.shape[0]
  chex.assert_shape([temperature, top_k, top_p], (batch,))
  logits = logits.astype(jnp.float32)
  greedy = temperature < GREEDY_TEMPERATURE
  safe_t = jnp.where(greedy, 1.0, temperature).astype(jnp.float32)
  scaled = logits / safe_t[:, None]
  needs_truncation = jnp.any(~greedy & (((top_k > 0) & (top_k < logits.shape[-1])) | (top_p < 1.0)))
  keep = jax.lax.cond(
    needs_truncation,
    lambda: truncation_mask(scaled, jnp.where(greedy, 0, top_k), jnp.where(greedy, 1.0, top_p)),
    lambda: jnp.ones(scaled.shape, bool),
  )
  truncated = jnp.where(keep, scaled, -jnp.inf)
  logprobs_all = jax.nn.log_softmax(truncated, axis=-1)
  drawn = draw_from_probs(jnp.exp(logprobs_all), keys)
  tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), drawn).astype(jnp.int32)
  logprobs = jnp.take_along_axis(logprobs_all, tokens[:, None], axis=-1)[:, 0]
  return tokens, logprobs


def _last_reachable(mass: jax.Array, before: jax.Array, target: jax.Array) -> jax.Array:
  """Index of the last entry with mass > 0 whose exclusive prefix `before` is < target.

  mass, before: float32[B, K]; target float32[B] in (0, total]. Such an entry always exists when
  the first entry with mass > 0 has before < target (its before is the exact sum of zeros, 0, or
  the caller's offset), so a zero-mass entry is never chosen, even after rounding.
  """
  k = mass.shape[-1]
  ok = (mass > 0) & (before < target[:, None])
  return jnp.max(jnp.where(ok, jnp.arange(k, dtype=jnp.int32)[None, :], -1), axis=-1)


def draw_from_probs(probs: jax.Array, keys: jax.Array) -> jax.Array:
  """One token per row from `probs` by the inverse CDF, two-level (see the module docstring).

  Args:
    probs: float32[B, V], each row >= 0 with a positive sum (need not be exactly 1).
    keys: PRNG keys, one per row.
  Returns:
    int32[B]; a token with probability 0 is never returned.
  """
  chex.assert_rank(probs, 2)
  batch, vocab = probs.shape
  blocks = -(-vocab // DRAW_BLOCK)
  padded = jnp.pad(probs, ((0, 0), (0, blocks * DRAW_BLOCK - vocab))).reshape(batch, blocks, DRAW_BLOCK)
  block_mass = jnp.sum(padded, axis=-1)  # [B, blocks]
  block_before = jnp.cumsum(block_mass, axis=-1) - block_mass
  total = block_before[:, -1] + block_mass[:, -1]
  uniform = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)  # [0, 1)
  target = (1.0 - uniform) * total  # (0, total]
  block = _last_reachable(block_mass, block_before, target)  # [B]
  in_block = jnp.take_along_axis(padded, block[:, None, None], axis=1)[:, 0]  # [B, DRAW_BLOCK]
  before = jnp.take_along_axis(block_before, block[:, None], axis=1) + jnp.cumsum(in_block, axis=-1) - in_block
  return block * DRAW_BLOCK + _last_reachable(in_block, before, target)
