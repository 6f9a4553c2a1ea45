"""How far the sampler's log-probs are from the trainer's on the same tokens. Pure jnp.

The trainer logs these every step: a growing mismatch means the sampler serves stale or wrongly
synced weights, or a numerics gap (dtype, kernels) that off-policy corrections must absorb.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def logprob_mismatch_metrics(
  sampler_logprobs: jax.Array, trainer_logprobs: jax.Array, mask: jax.Array
) -> dict[str, jax.Array]:
  """Summary of Δ = trainer_logprobs - sampler_logprobs over the masked tokens.

  Args:
    sampler_logprobs: float[B, T], log π_sampler(token) as returned by the sampler.
    trainer_logprobs: float[B, T], log π_trainer(token) recomputed by the trainer.
    mask: bool/float[B, T], 1 on sampler-generated tokens (the action mask).
  Returns:
    float32 scalars: `mean_abs_diff` (mean |Δ|), `max_abs_diff`, `mean_diff` (mean Δ),
    `kl_k1` (mean -Δ, the k1 estimate of KL(sampler || trainer) on sampler tokens), `kl_k3`
    (mean exp(Δ) - 1 - Δ, Schulman's k3 estimate, >= 0 per token), `ratio_mean`, `ratio_max`,
    `ratio_min` (of π_trainer / π_sampler = exp(Δ)), `num_tokens`. All 0 when the mask is empty
    (ratio_* are then 1).
  """
  chex.assert_rank([sampler_logprobs, trainer_logprobs, mask], 2)
  chex.assert_equal_shape([sampler_logprobs, trainer_logprobs, mask])
  m = mask.astype(bool)
  delta = trainer_logprobs.astype(jnp.float32) - sampler_logprobs.astype(jnp.float32)
  delta = jnp.where(m, delta, 0.0)
  n = jnp.sum(m).astype(jnp.float32)
  denom = jnp.maximum(n, 1.0)
  ratio = jnp.exp(delta)
  abs_delta = jnp.abs(delta)
  return {
    "mean_abs_diff": jnp.sum(abs_delta) / denom,
    "max_abs_diff": jnp.max(abs_delta),
    "mean_diff": jnp.sum(delta) / denom,
    "kl_k1": -jnp.sum(delta) / denom,
    "kl_k3": jnp.sum(jnp.where(m, ratio - 1.0 - delta, 0.0)) / denom,
    "ratio_mean": jnp.where(n > 0, jnp.sum(jnp.where(m, ratio, 0.0)) / denom, 1.0),
    "ratio_max": jnp.max(jnp.where(m, ratio, -jnp.inf), initial=1.0),
    "ratio_min": jnp.min(jnp.where(m, ratio, jnp.inf), initial=1.0),
    "num_tokens": n,
  }
