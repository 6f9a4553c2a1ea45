"""Policy, value and KL losses: pure, jittable functions over `[B, T]` arrays with a mask.

Every loss returns `(loss_sum, denom, metrics)`: an unreduced sum and its denominator, so that
for micro-batches k of one batch, sum_k loss_sum_k / sum_k denom_k equals the full-batch loss
exactly (gradient accumulation: get the global denominator first, e.g. with `denominator`,
then differentiate `loss_sum / global_denom` per micro-batch and add the gradients).
`metrics` are masked means over the tokens of the call, plus `n_tokens` to weight them.

Aggregation modes (`aggregate`), with m the 0/1 mask, n_b = sum_t m[b, t] and S the set of
rows with n_b > 0 (all-masked rows never count):
  token-mean              sum_bt l*m / sum_bt m
  seq-mean-token-mean     sum_{b in S} (sum_t l*m / n_b) / |S|
  seq-mean-token-sum      sum_bt l*m / |S|
  seq-mean-token-sum-norm sum_bt l*m / (|S| * C), C = `norm_len` (default: T, the padded
                          length of the arrays passed; pass a fixed C, e.g. the max new
                          tokens, when micro-batches are padded to different lengths). This is
                          Dr.GRPO's length-constant loss (TRL's `dr_grpo` divides by B * C).
Definitions follow verl's `core_algos.py`; string arguments (agg, kind) are static under jit.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from agentfly_jax.rl.core import _validate as v

Array = jnp.ndarray
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3", "k1+", "k2+", "k3+")
LOG_RATIO_CLAMP = 20.0  # |log pi/pi_old| clamp in PPO, as verl
GSPO_LOG_RATIO_MAX = 10.0  # upper clamp of GSPO's log sequence ratio, as verl


# --------------------------------------------------------------------------- aggregation
def _masked_tokens(fn: str, name: str, x, mask) -> tuple[Array, Array]:
  x = v.float_array(fn, name, x)
  mask = v.mask_array(fn, "mask", mask)
  v.check_rank(fn, name, x, 2, "[B, T]")
  v.check_shape(fn, "mask", mask, x.shape, name)
  return x, mask


def sequence_ids(shape: tuple, segment_ids: Array | None) -> tuple[Array | None, int]:
  """(int32[B, T] sequence index of each token, number of sequence slots) for packed rows
  (`segment_ids` int[B, T], runs of equal ids within a row), or (None, B) for one sequence per row."""
  if segment_ids is None:
    return None, shape[0]
  b, t = shape
  return (jnp.arange(b, dtype=jnp.int32)[:, None] * t + segment_ids.astype(jnp.int32)), b * t


def sequence_sums(x: Array, segment_ids: Array | None = None) -> Array:
  """Per-sequence sums of x float[B, T]: float[B] (rows), or with packed `segment_ids` one slot
  per possible (row, segment id) pair, float[B * T] (unused slots are 0)."""
  seq, n = sequence_ids(x.shape, segment_ids)
  if seq is None:
    return x.sum(axis=1)
  return jax.ops.segment_sum(x.reshape(-1), seq.reshape(-1), num_segments=n)


def per_token_of_sequence(values: Array, shape: tuple, segment_ids: Array | None = None) -> Array:
  """Broadcast per-sequence `values` (from `sequence_sums`) back to float[B, T] tokens."""
  seq, _ = sequence_ids(shape, segment_ids)
  return values[:, None] * jnp.ones(shape, values.dtype) if seq is None else values[seq]


def aggregate(
  per_token: Array,
  mask: Array,
  mode: str = "token-mean",
  *,
  norm_len: int | None = None,
  segment_ids: Array | None = None,
) -> tuple[Array, Array]:
  """Reduce a per-token loss to (loss_sum, denom); the mean is loss_sum / denom.

  Args:
    per_token: float[B, T]; mask: bool/float[B, T] (0/1); mode: one of AGG_MODES (see the
    module docstring); norm_len: C for seq-mean-token-sum-norm; segment_ids: int[B, T] for
    packed rows (several sequences per row): the seq-mean modes then count each segment as
    one sequence, exactly as if each sat in its own row.
  Returns:
    (loss_sum float[], denom float[]), both additive over micro-batches (rows split).
  """
  fn = "aggregate"
  v.check_choice(fn, "aggregation mode", mode, AGG_MODES)
  per_token, mask = _masked_tokens(fn, "per_token", per_token, mask)
  x = jnp.where(mask > 0, per_token * mask, 0.0)  # no NaN leaks from masked positions
  if segment_ids is not None:
    v.check_shape(fn, "segment_ids", segment_ids, per_token.shape, "per_token")
  n_tok = sequence_sums(mask.astype(x.dtype), segment_ids)
  n_seq = (n_tok > 0).sum().astype(x.dtype)
  if mode == "token-mean":
    return x.sum(), n_tok.sum()
  if mode == "seq-mean-token-mean":
    return (sequence_sums(x, segment_ids) / jnp.maximum(n_tok, 1e-8)).sum(), n_seq
  if mode == "seq-mean-token-sum":
    return x.sum(), n_seq
  c = per_token.shape[1] if norm_len is None else norm_len
  if isinstance(c, (int, float)) and c <= 0:
    raise ValueError(f"aggregate: norm_len must be > 0, got {norm_len!r}")
  return x.sum(), n_seq * c


def denominator(mask: Array, mode: str = "token-mean", *, norm_len: int | None = None) -> Array:
  """The `denom` that `aggregate` returns for this mask and mode (needs no loss). float[]."""
  mask = v.mask_array("denominator", "mask", mask)
  return aggregate(jnp.zeros(mask.shape, jnp.float32), mask, mode, norm_len=norm_len)[1]


def global_mean(loss_sum: Array, denom: Array) -> Array:
  """loss_sum / denom, and 0 where denom is 0 (an all-masked batch). float[]."""
  return loss_sum / jnp.where(denom > 0, denom, 1.0)


def _mean(x: Array, mask: Array) -> Array:
  x = jnp.where(mask > 0, x * mask, 0.0)
  return jax.lax.stop_gradient(x.sum() / jnp.maximum(mask.sum(), 1.0))


# --------------------------------------------------------------------------- KL
def kl_penalty(logprobs: Array, ref_logprobs: Array, kind: str = "k3") -> Array:
  """Per-token KL estimate between the policy and a reference (Schulman's k1/k2/k3).

  With d = logprobs - ref_logprobs:
    k1 = d;  k2 = d^2 / 2;  k3 = exp(-d) + d - 1 with -d clamped to [-20, 20] and the result
    clamped to [-10, 10] (verl "low_var_kl").
  The `+` variants (verl): forward value of k1/k2/k3, gradient of k2, i.e. d/dlogprobs = d,
  the unbiased KL gradient (straight-through: k2 - sg(k2) + sg(k*)). k2+ is k2.

  Args:
    logprobs, ref_logprobs: float[B, T] (any equal shapes work).
  Returns:
    float[B, T], unmasked: aggregate it with `aggregate(kl, mask, mode)`.
  """
  fn = "kl_penalty"
  v.check_choice(fn, "KL kind", kind, KL_KINDS)
  logprobs = v.float_array(fn, "logprobs", logprobs)
  ref_logprobs = v.float_array(fn, "ref_logprobs", ref_logprobs)
  v.check_shape(fn, "ref_logprobs", ref_logprobs, logprobs.shape, "logprobs")
  d = logprobs - ref_logprobs
  base = kind.rstrip("+")
  if base == "k1":
    fwd = d
  elif base == "k2":
    fwd = 0.5 * d * d
  else:
    nd = jnp.clip(-d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    fwd = jnp.clip(jnp.exp(nd) - nd - 1.0, -10.0, 10.0)
  if not kind.endswith("+") or base == "k2":
    return fwd
  k2 = 0.5 * d * d
  return k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(fwd)


def kl_loss(
  logprobs: Array,
  ref_logprobs: Array,
  mask: Array,
  *,
  kind: str = "k3",
  agg: str = "token-mean",
  norm_len: int | None = None,
) -> tuple[Array, Array, dict]:
  """KL-to-reference loss term: `aggregate(kl_penalty(logprobs, ref_logprobs, kind), mask, agg)`.

  Args:
    logprobs, ref_logprobs: float[B, T]; mask: bool/float[B, T]; kind: one of KL_KINDS.
  Returns:
    (loss_sum, denom, metrics) with metrics kl (masked mean of the forward value), n_tokens.
  """
  fn = "kl_loss"
  v.check_choice(fn, "aggregation mode", agg, AGG_MODES)
  logprobs, mask = _masked_tokens(fn, "logprobs", logprobs, mask)
  kl = kl_penalty(logprobs, ref_logprobs, kind)
  loss_sum, denom = aggregate(kl, mask, agg, norm_len=norm_len)
  return loss_sum, denom, {"kl": _mean(kl, mask), "n_tokens": jax.lax.stop_gradient(mask.sum())}


# --------------------------------------------------------------------------- policy losses
def _check_policy(fn, logprobs, old_logprobs, advantages, mask, is_weights, agg):
  v.check_choice(fn, "aggregation mode", agg, AGG_MODES)
  logprobs, mask = _masked_tokens(fn, "logprobs", logprobs, mask)
  old_logprobs = v.float_array(fn, "old_logprobs", old_logprobs)
  advantages = v.float_array(fn, "advantages", advantages)
  v.check_shape(fn, "old_logprobs", old_logprobs, logprobs.shape, "logprobs")
  v.check_shape(fn, "advantages", advantages, logprobs.shape, "logprobs")
  if is_weights is not None:
    is_weights = v.float_array(fn, "is_weights", is_weights)
    v.check_shape(fn, "is_weights", is_weights, logprobs.shape, "logprobs")
    is_weights = jax.lax.stop_gradient(is_weights)
  return logprobs, old_logprobs, advantages, mask, is_weights


def _dual_clip_on(dual_clip) -> bool:
  """None or a Python 0 turn dual-clip off (static); a traced value leaves it on."""
  return dual_clip is not None and not (isinstance(dual_clip, (int, float)) and dual_clip == 0)


def _check_clips(fn, clip_low, clip_high, dual_clip):
  for name, c in (("clip_low", clip_low), ("clip_high", clip_high)):
    if isinstance(c, (int, float)) and not 0 <= c:
      raise ValueError(f"{fn}: {name} must be >= 0, got {c!r}")
  if _dual_clip_on(dual_clip) and isinstance(dual_clip, (int, float)) and not dual_clip > 1.0:
    raise ValueError(f"{fn}: dual_clip must be > 1 (or None / 0 to disable), got {dual_clip!r}")


def _clipped_surrogate(
  ratio,
  adv,
  mask,
  token_log_ratio,
  logprobs,
  old_logprobs,
  *,
  clip_low,
  clip_high,
  dual_clip,
  is_weights,
  agg,
  norm_len,
  segment_ids=None,
):
  """The clipped objective shared by PPO and GSPO; all arrays float[B, T]."""
  loss_unclipped = -adv * ratio
  loss_clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  loss = jnp.maximum(loss_unclipped, loss_clipped)
  clipped = loss_clipped > loss_unclipped
  dual_active = jnp.zeros_like(clipped)
  if _dual_clip_on(dual_clip):
    loss_dual = -adv * dual_clip
    dual_active = (adv < 0) & (loss > loss_dual)
    loss = jnp.where(adv < 0, jnp.minimum(loss, loss_dual), loss)
  if is_weights is not None:
    loss = loss * is_weights
  loss_sum, denom = aggregate(loss, mask, agg, norm_len=norm_len, segment_ids=segment_ids)
  metrics = {
    "clipfrac": _mean(clipped, mask),
    "clipfrac_high": _mean(clipped & (ratio > 1.0), mask),
    "clipfrac_low": _mean(clipped & (ratio < 1.0), mask),
    "dual_clip_frac": _mean(dual_active, mask),
    "ppo_kl": _mean(-token_log_ratio, mask),
    "approx_kl": _mean(kl_penalty(logprobs, old_logprobs, "k3"), mask),
    "ratio_mean": _mean(ratio, mask),
    "n_tokens": jax.lax.stop_gradient(mask.sum()),
  }
  return loss_sum, denom, metrics


def policy_loss(
  logprobs: Array,
  old_logprobs: Array,
  advantages: Array,
  mask: Array,
  *,
  clip_low: float = 0.2,
  clip_high: float = 0.28,  # DAPO clip-higher: rl/spec.py LossSection's default
  dual_clip: float | None = 3.0,
  agg: str = "token-mean",
  is_weights: Array | None = None,
  norm_len: int | None = None,
  segment_ids: Array | None = None,
) -> tuple[Array, Array, dict]:
  """PPO clipped surrogate with clip-higher and dual-clip (verl `compute_policy_loss_vanilla`).

  ratio = exp(clamp(logprobs - old_logprobs, -20, 20));
  l = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high));
  dual-clip (arXiv 1912.09729), where A < 0: l = min(l, -A * dual_clip); `dual_clip` None or
  0 turns it off. Optional `is_weights` (e.g. truncated sampler/trainer importance weights)
  multiply l per token and get no gradient. Tokens whose log-ratio is beyond the clamp get no
  gradient.

  Args:
    logprobs: float[B, T] current policy; old_logprobs: float[B, T]; advantages: float[B, T];
    mask: bool/float[B, T]; is_weights: float[B, T] or None; agg, norm_len, segment_ids: see `aggregate`.
  Returns:
    (loss_sum, denom, metrics) with metrics clipfrac, clipfrac_high (A > 0, ratio > 1 +
    clip_high), clipfrac_low (A < 0, ratio < 1 - clip_low), dual_clip_frac (A < 0, ratio >
    dual_clip), ppo_kl (mean of old - new logprob, clamped), approx_kl (k3), ratio_mean,
    n_tokens.
  """
  fn = "policy_loss"
  logprobs, old_logprobs, adv, mask, is_weights = _check_policy(
    fn, logprobs, old_logprobs, advantages, mask, is_weights, agg
  )
  _check_clips(fn, clip_low, clip_high, dual_clip)
  log_ratio = jnp.clip(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return _clipped_surrogate(
    jnp.exp(log_ratio),
    adv,
    mask,
    log_ratio,
    logprobs,
    old_logprobs,
    clip_low=clip_low,
    clip_high=clip_high,
    dual_clip=dual_clip,
    is_weights=is_weights,
    agg=agg,
    norm_len=norm_len,
    segment_ids=segment_ids,
  )


def gspo_policy_loss(
  logprobs: Array,
  old_logprobs: Array,
  advantages: Array,
  mask: Array,
  *,
  clip_low: float = 3e-4,
  clip_high: float = 4e-4,
  dual_clip: float | None = None,
  agg: str = "seq-mean-token-mean",
  is_weights: Array | None = None,
  norm_len: int | None = None,
  segment_ids: Array | None = None,
) -> tuple[Array, Array, dict]:
  """GSPO (arXiv 2507.18071) with verl's `compute_policy_loss_gspo` definition.

  Sequence log-ratio: s_b = sum_t m*(logprobs - old_logprobs) / max(n_b, 1) (geometric mean of
  the token ratios). Token ratio r_bt = exp(min(logprobs - sg(logprobs) + sg(s_b), 10)): its
  value is the sequence ratio, its gradient flows through each token's log-prob.
  l = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)). Defaults are the paper's
  clip ranges (3e-4, 4e-4) and aggregation (verl always uses seq-mean-token-mean).
  `dual_clip` is an extension that neither the paper nor verl has: off by default (None or
  0); a value > 1 caps the loss of A < 0 tokens at -A * dual_clip, as in `policy_loss`. Pass
  None for verl's GSPO.

  Args / Returns: as `policy_loss`; ratio_mean is the mean sequence ratio over tokens.
  """
  fn = "gspo_policy_loss"
  logprobs, old_logprobs, adv, mask, is_weights = _check_policy(
    fn, logprobs, old_logprobs, advantages, mask, is_weights, agg
  )
  _check_clips(fn, clip_low, clip_high, dual_clip)
  token_log_ratio = jnp.where(mask > 0, logprobs - old_logprobs, 0.0)
  n_tok = sequence_sums(mask.astype(logprobs.dtype), segment_ids)
  seq_log_ratio = sequence_sums(token_log_ratio * mask, segment_ids) / jnp.maximum(n_tok, 1.0)
  log_ratio = (
    logprobs
    - jax.lax.stop_gradient(logprobs)
    + jax.lax.stop_gradient(per_token_of_sequence(seq_log_ratio, logprobs.shape, segment_ids))
  )
  ratio = jnp.exp(jnp.minimum(log_ratio, GSPO_LOG_RATIO_MAX))
  return _clipped_surrogate(
    ratio,
    adv,
    mask,
    token_log_ratio,
    logprobs,
    old_logprobs,
    clip_low=clip_low,
    clip_high=clip_high,
    dual_clip=dual_clip,
    is_weights=is_weights,
    agg=agg,
    norm_len=norm_len,
    segment_ids=segment_ids,
  )


def decoupled_ppo_loss(
  logprobs: Array,
  old_logprobs: Array,
  advantages: Array,
  mask: Array,
  *,
  behaviour_logprobs: Array,
  behaviour_cap: float = 2.0,
  clip_low: float = 0.2,
  clip_high: float = 0.28,  # DAPO clip-higher: rl/spec.py LossSection's default
  dual_clip: float | None = 3.0,
  agg: str = "token-mean",
  is_weights: Array | None = None,
  norm_len: int | None = None,
  segment_ids: Array | None = None,
) -> tuple[Array, Array, dict]:
  """Decoupled PPO for off-policy (asynchronous) rollouts, as in AReaL (arXiv 2505.24298).

  Three policies: the behaviour policy that sampled the tokens (`behaviour_logprobs`, from the
  sampler, possibly several versions old), the proximal policy (`old_logprobs`: the trainer's
  params when the batch arrived) and the current one (`logprobs`). The clipped surrogate is
  taken against the proximal policy, and each token's loss is weighted by the truncated
  importance weight w = min(pi_prox / pi_behav, behaviour_cap) (no gradient):
    l = w * max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)),  r = pi / pi_prox
  (+ dual-clip as in `policy_loss`). With pi_behav == pi_prox it is `policy_loss`.

  Args: as `policy_loss` (segment_ids for packed rows), plus behaviour_logprobs float[B, T] and
  behaviour_cap > 0.
  Returns: as `policy_loss`; metrics add behaviour_weight_mean and behaviour_capped_frac.
  """
  fn = "decoupled_ppo_loss"
  behaviour_logprobs = v.float_array(fn, "behaviour_logprobs", behaviour_logprobs)
  v.check_shape(fn, "behaviour_logprobs", behaviour_logprobs, jnp.shape(logprobs), "logprobs")
  if isinstance(behaviour_cap, (int, float)) and not behaviour_cap > 0:
    raise ValueError(f"{fn}: behaviour_cap must be > 0, got {behaviour_cap!r}")
  raw = jnp.exp(
    jnp.clip(jnp.asarray(old_logprobs, jnp.float32) - behaviour_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  )
  w = jax.lax.stop_gradient(jnp.minimum(raw, behaviour_cap))
  weights = w if is_weights is None else w * is_weights
  loss_sum, denom, metrics = policy_loss(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    clip_low=clip_low,
    clip_high=clip_high,
    dual_clip=dual_clip,
    agg=agg,
    is_weights=weights,
    norm_len=norm_len,
    segment_ids=segment_ids,
  )
  mask_f = jnp.asarray(mask, jnp.float32)
  metrics["behaviour_weight_mean"] = _mean(w, mask_f)
  metrics["behaviour_capped_frac"] = _mean(raw > behaviour_cap, mask_f)
  return loss_sum, denom, metrics


_POLICY_LOSSES: dict[str, Callable] = {
  "ppo": policy_loss,
  "gspo": gspo_policy_loss,
  "decoupled_ppo": decoupled_ppo_loss,
}


def register_policy_loss(name: str, fn: Callable) -> None:
  """Register a policy loss with `policy_loss`'s signature and return convention."""
  if name in _POLICY_LOSSES:
    raise ValueError(f"policy loss {name!r} is already registered")
  _POLICY_LOSSES[name] = fn


def policy_loss_names() -> tuple[str, ...]:
  """The registered policy-loss names."""
  return tuple(_POLICY_LOSSES)


def get_policy_loss(name: str) -> Callable:
  """The policy loss registered under `name` ("ppo", "gspo", ...); ValueError otherwise."""
  v.check_choice("losses.get_policy_loss", "policy loss", name, _POLICY_LOSSES)
  return _POLICY_LOSSES[name]


# --------------------------------------------------------------------------- value loss
def value_loss(
  values: Array,
  old_values: Array,
  returns: Array,
  mask: Array,
  *,
  clip: float | None = 0.5,
  agg: str = "token-mean",
  norm_len: int | None = None,
  segment_ids: Array | None = None,
) -> tuple[Array, Array, dict]:
  """Clipped value loss (verl `compute_value_loss`):
  l = 0.5 * max((V - R)^2, (old + clip(V - old, -clip, clip) - R)^2); `clip=None`: 0.5 (V - R)^2.

  Args:
    values: float[B, T] current critic; old_values: float[B, T] critic at rollout time;
    returns: float[B, T] targets; mask: bool/float[B, T]; agg, norm_len: see `aggregate`.
  Returns:
    (loss_sum, denom, metrics) with metrics vf_clipfrac (the fraction of tokens where the clip
    changed V, |V - old| > clip, and the clipped branch is the larger: a tie such as V == old at a
    step's first minibatch is no clip, however rounding orders the two equal branches),
    value_mean, returns_mean, n_tokens.
  """
  fn = "value_loss"
  v.check_choice(fn, "aggregation mode", agg, AGG_MODES)
  values, mask = _masked_tokens(fn, "values", values, mask)
  old_values = v.float_array(fn, "old_values", old_values)
  returns = v.float_array(fn, "returns", returns)
  v.check_shape(fn, "old_values", old_values, values.shape, "values")
  v.check_shape(fn, "returns", returns, values.shape, "values")
  if clip is not None and isinstance(clip, (int, float)) and clip < 0:
    raise ValueError(f"{fn}: clip must be >= 0 (or None), got {clip!r}")
  loss_unclipped = jnp.square(values - returns)
  if clip is None:
    loss, clipped = loss_unclipped, jnp.zeros(values.shape, bool)
  else:
    values_clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    loss_clipped = jnp.square(values_clipped - returns)
    loss = jnp.maximum(loss_unclipped, loss_clipped)
    clipped = (jnp.abs(values - old_values) > clip) & (loss_clipped > loss_unclipped)
  loss_sum, denom = aggregate(0.5 * loss, mask, agg, norm_len=norm_len, segment_ids=segment_ids)
  metrics = {
    "vf_clipfrac": _mean(clipped, mask),
    "value_mean": _mean(values, mask),
    "returns_mean": _mean(returns, mask),
    "n_tokens": jax.lax.stop_gradient(mask.sum()),
  }
  return loss_sum, denom, metrics


# --------------------------------------------------------------------------- from logits
def _check_logits(fn, logits, temperature):
  logits = v.float_array(fn, "logits", logits)
  v.check_rank(fn, "logits", logits, 3, "[B, T, V]")
  if isinstance(temperature, (int, float)) and not temperature > 0:
    raise ValueError(f"{fn}: temperature must be > 0, got {temperature!r}")
  return logits


def token_logprobs(logits: Array, targets: Array, temperature: float = 1.0) -> Array:
  """log softmax(logits / temperature)[targets], without materialising the log-softmax.

  Computed as (z[target] - max z) / temperature - log sum exp((z - max z) / temperature) in
  float32 (bf16 logits are upcast inside the fused reductions): under jit XLA keeps no
  [B, T, V] temporary in the forward or the backward pass (checked in the tests).

  Args:
    logits: float[B, T, V]; targets: int[B, T] (ids in [0, V)); temperature: > 0.
  Returns:
    float[B, T].
  """
  fn = "token_logprobs"
  logits = _check_logits(fn, logits, temperature)
  targets = v.int_array(fn, "targets", targets)
  v.check_shape(fn, "targets", targets, logits.shape[:2], "logits[:2]")
  picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  # the shift is exact for the value and cancels in the gradient, so it gets none
  top = jax.lax.stop_gradient(logits.max(axis=-1).astype(jnp.float32))
  sum_exp = jnp.exp((logits.astype(jnp.float32) - top[..., None]) / temperature).sum(axis=-1)
  return (picked.astype(jnp.float32) - top) / temperature - jnp.log(sum_exp)


def entropy_from_logits(logits: Array, temperature: float = 1.0) -> Array:
  """Entropy of softmax(logits / temperature) per position: logsumexp(z) - sum softmax(z) z.

  Args:
    logits: float[B, T, V]; temperature: > 0.
  Returns:
    float[B, T]; aggregate it with `aggregate(entropy, mask, mode)`.
  """
  z = _check_logits("entropy_from_logits", logits, temperature).astype(jnp.float32) / temperature
  lse = jax.nn.logsumexp(z, axis=-1)
  p = jnp.exp(z - lse[..., None])
  return lse - jnp.where(p > 0, p * z, 0.0).sum(axis=-1)  # -inf logits (p = 0) add nothing
