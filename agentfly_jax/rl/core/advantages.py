"""Advantage estimators: pure, jittable functions over `[B]` scores and `[B, T]` token arrays.

Conventions (all estimators):
  * `scores: float[B]` is one outcome reward per trajectory (row); `group_ids: int[B]` marks rows
    that answer the same prompt (any integers; equal id = same group; padding rows should get
    ids of their own). Groups are found with `jnp.unique(size=B)`, so everything jits.
  * `mask: bool/float[B, T]` is the action mask: 1 exactly on tokens the model wrote. A
    multi-turn trajectory is ONE row whose observation/tool tokens (mask 0) sit between the
    model's turns.
  * Token outputs are 0 at masked positions.
  * Definitions follow verl's `core_algos.py`, except that returns and GAE carry credit across
    masked segments (see `discounted_returns` and `gae`): every turn's tokens see the final
    outcome.

Estimators are registered by name (`get(name)`, `names()`); `compute(name, ...)` calls any of
them with one keyword signature and always returns token-level `(advantages, returns)`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from agentfly_jax.rl.core import _validate as v

Array = jnp.ndarray


# --------------------------------------------------------------------------- groups
def _group_stats(scores: Array, group_ids: Array) -> tuple[Array, Array, Array]:
  """Per-row group size, centred score and Bessel-corrected group std.

  Args:
    scores: float[B].
    group_ids: int[B].
  Returns:
    (count[B], centred[B] = score - group mean, std[B]); std is 0 for singleton groups.
  The mean is taken relative to the group's max, so a constant group gives exactly 0.
  """
  b = scores.shape[0]
  _, idx = jnp.unique(group_ids, return_inverse=True, size=b, fill_value=0)
  idx = idx.reshape(b)
  count = jax.ops.segment_sum(jnp.ones_like(scores), idx, num_segments=b)
  shift = jax.ops.segment_max(scores, idx, num_segments=b)[idx]
  diff = scores - shift  # exact 0 for every member of a constant group
  mean_diff = jax.ops.segment_sum(diff, idx, num_segments=b) / jnp.maximum(count, 1.0)
  centred = diff - mean_diff[idx]
  sq = jax.ops.segment_sum(centred * centred, idx, num_segments=b)
  std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))
  return count[idx], centred, std[idx]


def _check_scores(fn: str, scores, group_ids) -> tuple[Array, Array]:
  scores = v.float_array(fn, "scores", scores)
  group_ids = v.int_array(fn, "group_ids", group_ids)
  v.check_rank(fn, "scores", scores, 1, "[B]")
  v.check_shape(fn, "group_ids", group_ids, scores.shape, "scores")
  return scores, group_ids


def _check_tokens(fn: str, x_name: str, x, mask) -> tuple[Array, Array]:
  x = v.float_array(fn, x_name, x)
  mask = v.mask_array(fn, "mask", mask)
  v.check_rank(fn, x_name, x, 2, "[B, T]")
  v.check_shape(fn, "mask", mask, x.shape, x_name)
  return x, mask


def grpo(scores: Array, group_ids: Array, *, norm_by_std: bool = True, eps: float = 1e-6) -> Array:
  """GRPO outcome advantage (verl `compute_grpo_outcome_advantage`).

  A_i = (s_i - mean_g) / (std_g + eps), std Bessel-corrected (torch.std); with
  `norm_by_std=False`, A_i = s_i - mean_g. A singleton group uses mean 0 and std 1 (verl), so
  its advantage is s / (1 + eps). A zero-variance group gives exactly 0.

  Args:
    scores: float[B]; group_ids: int[B].
  Returns:
    float[B]. Use `broadcast_to_tokens` for the token-level array.
  """
  scores, group_ids = _check_scores("grpo", scores, group_ids)
  count, centred, std = _group_stats(scores, group_ids)
  single = count <= 1
  centred = jnp.where(single, scores, centred)
  if not norm_by_std:
    return centred
  return centred / (jnp.where(single, 1.0, std) + eps)


def drgrpo(scores: Array, group_ids: Array, *, eps: float = 1e-6) -> Array:
  """Dr.GRPO advantage: GRPO without the std division, A_i = s_i - mean_g. float[B].

  This is only the advantage half of Dr.GRPO (arXiv 2503.20783). The other half, dropping the
  per-response length normalisation, is a loss choice here: use
  `losses.aggregate(..., mode="seq-mean-token-sum-norm")`. TRL uses the name differently:
  its `loss_type="dr_grpo"` is that length-constant loss aggregation (sum / (B *
  max_completion_length)) and the std scaling is a separate flag (`scale_rewards`). `eps` is
  accepted for a uniform signature and unused.
  """
  del eps
  return grpo(scores, group_ids, norm_by_std=False)


def rloo(scores: Array, group_ids: Array) -> Array:
  """RLOO leave-one-out advantage: A_i = s_i - mean of the other members of i's group.

  Equals n/(n-1) * (s_i - mean_g). A singleton group keeps its raw score (verl).

  Args:
    scores: float[B]; group_ids: int[B].
  Returns:
    float[B].
  """
  scores, group_ids = _check_scores("rloo", scores, group_ids)
  count, centred, _ = _group_stats(scores, group_ids)
  scaled = centred * count / jnp.maximum(count - 1.0, 1.0)
  return jnp.where(count <= 1, scores, scaled)


# --------------------------------------------------------------------------- tokens
def broadcast_to_tokens(adv: Array, mask: Array) -> Array:
  """Sequence-level advantage on every action token: adv[b] * mask[b, t].

  Args:
    adv: float[B]; mask: bool/float[B, T].
  Returns:
    float[B, T], 0 at masked positions.
  """
  fn = "broadcast_to_tokens"
  adv = v.float_array(fn, "adv", adv)
  mask = v.mask_array(fn, "mask", mask)
  v.check_rank(fn, "adv", adv, 1, "[B]")
  v.check_rank(fn, "mask", mask, 2, "[B, T]")
  v.check_shape(fn, "mask", mask, (adv.shape[0], mask.shape[1]), "adv (first axis)")
  return adv[:, None] * mask


def masked_whiten(x: Array, mask: Array, *, eps: float = 1e-8, shift_mean: bool = True) -> Array:
  """Whiten `x` with the mean and Bessel-corrected variance of its unmasked entries (whole batch).

  (x - mean) * rsqrt(var + eps), as verl's `masked_whiten`. Where verl raises (fewer than 2
  unmasked entries) the variance is taken as 0 here, so the output stays finite under jit.

  Args:
    x: float[B, T]; mask: bool/float[B, T] (0/1).
  Returns:
    float[B, T], 0 at masked positions.
  """
  x, mask = _check_tokens("masked_whiten", "x", x, mask)
  n = mask.sum()
  xm = jnp.where(mask > 0, x, 0.0)
  mean = xm.sum() / jnp.maximum(n, 1.0)
  centred = jnp.where(mask > 0, x - mean, 0.0)
  var = (centred * centred).sum() / jnp.maximum(n - 1.0, 1.0)
  out = centred * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return out * mask


def scores_to_token_rewards(scores: Array, mask: Array) -> Array:
  """Place each row's outcome score on its last action token.

  Args:
    scores: float[B]; mask: bool/float[B, T].
  Returns:
    float[B, T]: scores[b] at the last t with mask[b, t] != 0, 0 elsewhere (all-0 rows: all 0).
  """
  fn = "scores_to_token_rewards"
  scores = v.float_array(fn, "scores", scores)
  mask = v.mask_array(fn, "mask", mask)
  v.check_rank(fn, "scores", scores, 1, "[B]")
  v.check_rank(fn, "mask", mask, 2, "[B, T]")
  v.check_shape(fn, "mask", mask, (scores.shape[0], mask.shape[1]), "scores (first axis)")
  t = mask.shape[1]
  active = mask > 0
  last = t - 1 - jnp.argmax(active[:, ::-1], axis=1)
  onehot = jax.nn.one_hot(last, t, dtype=scores.dtype) * active.any(axis=1, keepdims=True)
  return onehot * scores[:, None]


def discounted_returns(token_rewards: Array, mask: Array, *, gamma: float = 1.0) -> Array:
  """Discounted return per action token, carried across masked (observation) segments.

  Masked positions are not agent time steps: the running return is NOT reset there (verl
  resets it, which cuts earlier turns off from the outcome; AgentFly's fork does not) and is
  not discounted over them. A reward that lands on a masked position is credited to the
  closest earlier action token (rewards before the first action token have no action and are
  dropped). For action tokens t < t' consecutive among action tokens:
    G_t = r_t + (rewards on masked positions in (t, t')) + gamma * G_t'.
  With gamma = 1 this equals AgentFly's no-reset recursion; for gamma < 1 that recursion also
  discounts per observation token, this one does not. Equals `gae(..., values=0, lam=1)`'s
  returns.

  Args:
    token_rewards: float[B, T]; mask: bool/float[B, T].
  Returns:
    float[B, T], 0 at masked positions.
  """
  r, mask = _check_tokens("discounted_returns", "token_rewards", token_rewards, mask)
  active = mask > 0

  def step(carry, xs):
    g_next, pending = carry
    r_t, a_t = xs
    g = r_t + pending + gamma * g_next
    carry = (jnp.where(a_t, g, g_next), jnp.where(a_t, 0.0, pending + r_t))
    return carry, jnp.where(a_t, g, 0.0)

  zeros = jnp.zeros(r.shape[:1], r.dtype)
  _, out = jax.lax.scan(step, (zeros, zeros), (r.T, active.T), reverse=True)
  return out.T


def reinforce_pp(token_rewards: Array, mask: Array, *, gamma: float = 1.0, whiten: bool = True) -> Array:
  """REINFORCE++: `discounted_returns` (no reset at observation tokens), masked-whitened over
  the batch (verl `compute_reinforce_plus_plus_outcome_advantage`, minus its reset).

  Args:
    token_rewards: float[B, T] (e.g. `scores_to_token_rewards(scores, mask)`);
    mask: bool/float[B, T].
  Returns:
    float[B, T], 0 at masked positions.
  """
  returns = discounted_returns(token_rewards, mask, gamma=gamma)
  return masked_whiten(returns, mask) if whiten else returns


def reinforce_pp_baseline(scores: Array, group_ids: Array, mask: Array, *, eps: float = 1e-6) -> Array:
  """REINFORCE++ with a group-mean baseline: (s_i - mean_g) on every action token, then
  masked-whitened over the batch. A singleton group uses baseline 0 (verl).

  Args:
    scores: float[B]; group_ids: int[B]; mask: bool/float[B, T].
    eps: added to the variance in the whitening (verl uses 1e-8 there).
  Returns:
    float[B, T], 0 at masked positions.
  """
  scores, group_ids = _check_scores("reinforce_pp_baseline", scores, group_ids)
  count, centred, _ = _group_stats(scores, group_ids)
  adv = jnp.where(count <= 1, scores, centred)
  return masked_whiten(broadcast_to_tokens(adv, mask), mask, eps=eps)


def gae(
  token_rewards: Array, values: Array, mask: Array, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
) -> tuple[Array, Array]:
  """Generalised advantage estimation over action tokens only (verl
  `compute_gae_advantage_return`, which also skips observation tokens).

  Masked positions are skipped: the bootstrap value of action token t is the value at the
  next *action* token (0 after the last), and the GAE recursion runs over action tokens only.
  Rewards on masked positions are credited to the closest earlier action token, as in
  `discounted_returns`. For consecutive action tokens t < t':
    delta_t = r_t + (masked rewards in (t, t')) + gamma * V_t' - V_t
    A_t = delta_t + gamma * lam * A_t'
    returns_t = A_t + V_t   (the value target, never whitened)

  Args:
    token_rewards: float[B, T]; values: float[B, T] (critic values at each token);
    mask: bool/float[B, T].
    whiten: whiten the advantages over the batch with `masked_whiten` (verl does).
  Returns:
    (advantages float[B, T], returns float[B, T]), both 0 at masked positions.
  """
  fn = "gae"
  r, mask = _check_tokens(fn, "token_rewards", token_rewards, mask)
  values = v.float_array(fn, "values", values)
  v.check_shape(fn, "values", values, r.shape, "token_rewards")
  active = mask > 0

  def step(carry, xs):
    v_next, a_next, pending = carry
    r_t, v_t, act = xs
    adv = r_t + pending + gamma * v_next - v_t + gamma * lam * a_next
    carry = (jnp.where(act, v_t, v_next), jnp.where(act, adv, a_next), jnp.where(act, 0.0, pending + r_t))
    return carry, (jnp.where(act, adv, 0.0), jnp.where(act, adv + v_t, 0.0))

  zeros = jnp.zeros(r.shape[:1], r.dtype)
  _, (adv, ret) = jax.lax.scan(step, (zeros, zeros, zeros), (r.T, values.T, active.T), reverse=True)
  adv, ret = adv.T, ret.T
  if whiten:
    adv = masked_whiten(adv, mask)
  return adv, ret


# --------------------------------------------------------------------------- registry
_ESTIMATORS: dict[str, Callable] = {}
_TO_TOKENS: dict[str, Callable] = {}


def register(name: str, estimator: Callable, to_tokens: Callable) -> None:
  """Register `estimator` under `name`.

  `to_tokens(*, mask, scores, group_ids, token_rewards, values, gamma, lam, eps)` must return
  token-level `(advantages[B, T], returns[B, T])`; `compute(name, ...)` calls it.
  """
  if name in _ESTIMATORS:
    raise ValueError(f"advantage estimator {name!r} is already registered")
  _ESTIMATORS[name] = estimator
  _TO_TOKENS[name] = to_tokens


def names() -> tuple[str, ...]:
  """The registered estimator names."""
  return tuple(_ESTIMATORS)


def get(name: str) -> Callable:
  """The estimator registered under `name`; ValueError listing the known names otherwise."""
  v.check_choice("advantages.get", "advantage estimator", name, _ESTIMATORS)
  return _ESTIMATORS[name]


def _need(name: str, arg: str, x):
  if x is None:
    raise ValueError(f"advantages.compute({name!r}): argument `{arg}` is required")
  return x


def _rewards(name, mask, scores, token_rewards):
  if token_rewards is not None:
    return token_rewards
  return scores_to_token_rewards(_need(name, "scores or token_rewards", scores), mask)


def _outcome(fn, name):
  def to_tokens(*, mask, scores, group_ids, eps, **_):
    kw = {} if name == "rloo" else {"eps": eps}
    adv = fn(_need(name, "scores", scores), _need(name, "group_ids", group_ids), **kw)
    adv = broadcast_to_tokens(adv, mask)
    return adv, adv

  return to_tokens


def _rpp_tokens(*, mask, scores, token_rewards, gamma, **_):
  rewards = _rewards("reinforce_pp", mask, scores, token_rewards)
  returns = discounted_returns(rewards, mask, gamma=gamma)
  return masked_whiten(returns, mask), returns


def _rppb_tokens(*, mask, scores, group_ids, eps, **_):
  adv = reinforce_pp_baseline(
    _need("reinforce_pp_baseline", "scores", scores),
    _need("reinforce_pp_baseline", "group_ids", group_ids),
    mask,
    eps=eps,
  )
  return adv, adv


def _gae_tokens(*, mask, scores, token_rewards, values, gamma, lam, **_):
  rewards = _rewards("gae", mask, scores, token_rewards)
  return gae(rewards, _need("gae", "values", values), mask, gamma=gamma, lam=lam)


register("grpo", grpo, _outcome(grpo, "grpo"))
register("drgrpo", drgrpo, _outcome(drgrpo, "drgrpo"))
register("rloo", rloo, _outcome(rloo, "rloo"))
register("reinforce_pp", reinforce_pp, _rpp_tokens)
register("reinforce_pp_baseline", reinforce_pp_baseline, _rppb_tokens)
register("gae", gae, _gae_tokens)


def compute(
  name: str,
  *,
  mask: Array,
  scores: Array | None = None,
  group_ids: Array | None = None,
  token_rewards: Array | None = None,
  values: Array | None = None,
  gamma: float = 1.0,
  lam: float = 1.0,
  eps: float = 1e-6,
  turn_rewards: Array | None = None,
  anchor_ids: Array | None = None,
) -> tuple[Array, Array]:
  """Run estimator `name` with one signature; returns token-level (advantages, returns).

  Outcome estimators (grpo, drgrpo, rloo, reinforce_pp_baseline) need `scores` + `group_ids`
  and return their advantage as `returns` too (verl's convention). reinforce_pp and gae take
  `token_rewards`, or `scores` placed on each row's last action token; gae needs `values`.
  Turn-level estimators (turn_gae, gigpo: rl/core/turn_advantages.py) take `turn_rewards`
  float[B, K] (+ `scores` added to each row's last turn); gigpo also `anchor_ids` int[B, K].

  Args:
    mask: bool/float[B, T]; scores: float[B]; group_ids: int[B]; token_rewards, values:
    float[B, T].
  Returns:
    (advantages float[B, T], returns float[B, T]), 0 at masked positions.
  """
  get(name)
  return _TO_TOKENS[name](
    mask=mask,
    scores=scores,
    group_ids=group_ids,
    token_rewards=token_rewards,
    values=values,
    gamma=gamma,
    lam=lam,
    eps=eps,
    turn_rewards=turn_rewards,
    anchor_ids=anchor_ids,
  )
