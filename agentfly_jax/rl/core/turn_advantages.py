"""Turn-level advantage estimators: per-turn rewards, turns as the time steps (pure, jittable).

A chain's model turns are its time steps here, not its tokens: turn k of row b is the k-th maximal
run of action tokens of `mask[b]` (`turn_ids`), and every token of a turn gets the turn's advantage.
Rewards come per turn (`turn_rewards: float[B, K]`, e.g. the env's `StepResult.reward` after each
turn, recorded as `Trajectory.turn_rewards`); the row's outcome score is added to its last turn's.

  turn_gae   GAE over turns (PPO): V_k = the critic's value at turn k's first action token,
             delta_k = r_k + gamma * V_{k+1} - V_k (V after the last turn = 0),
             A_k = delta_k + gamma * lam * A_{k+1}; returns_k = A_k + V_k. Token advantages are
             then whitened over the batch (as `advantages.gae`).
  gigpo      GiGPO's two-level group baseline (arXiv 2505.10978) for critic-free runs:
             episode level  A^E_b = GRPO of the episode return R_b = sum_k r_{b,k} in b's group;
             step level     G_{b,k} = sum_{j >= k} gamma^(j-k) r_{b,j}, grouped by anchor state:
                            turns of one group whose preceding observation is the same
                            (`anchor_ids` equal) form a step group; A^S = (G - mean) / (std + eps)
                            over it (Bessel std), 0 for a step group of one turn;
             A_{b,k} = A^E_b + step_weight * A^S_{b,k}.

Shapes: B rows, T tokens, K turn slots (>= the most turns of any row; extra slots are ignored).
Registered in `advantages` (`compute("turn_gae" | "gigpo", ..., turn_rewards=, anchor_ids=)`); without
`turn_rewards` they see the outcome alone (on the last turn), without `anchor_ids` gigpo pools the
k-th turns of a group's chains (the trainer always passes both: rl/turn_rewards.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentfly_jax.rl.core import _validate as v
from agentfly_jax.rl.core import advantages as adv_lib

Array = jnp.ndarray


def turn_ids(mask: Array) -> Array:
  """int32[B, T]: the turn index (0, 1, ...) of each action token (the k-th run of consecutive
  action tokens is turn k), -1 off the action tokens. mask: bool/float[B, T]."""
  a = jnp.asarray(mask) > 0
  prev = jnp.pad(a[:, :-1], ((0, 0), (1, 0)))
  ids = jnp.cumsum(a & ~prev, axis=1, dtype=jnp.int32) - 1
  return jnp.where(a, ids, -1)


def turn_counts(mask: Array) -> Array:
  """int32[B]: how many turns (runs of action tokens) each row of mask [B, T] holds."""
  return turn_ids(mask).max(axis=1) + 1


def turns_to_tokens(x: Array, ids: Array) -> Array:
  """float[B, T]: x[b, ids[b, t]] on action tokens (ids >= 0), 0 elsewhere. x: float[B, K]; ids: int[B, T]."""
  k = x.shape[1]
  picked = jnp.take_along_axis(x, jnp.clip(ids, 0, k - 1), axis=1)
  return jnp.where(ids >= 0, picked, 0.0)


def turn_first_values(values: Array, ids: Array, k: int) -> Array:
  """float[B, K]: values[b, t] at the first action token of each turn (0 for absent turns)."""
  b, t = ids.shape
  first = (ids >= 0) & (ids != jnp.pad(ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1))
  slot = jnp.where(first & (ids < k), ids, k)  # k: out of range, dropped
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
  return jnp.zeros((b, k), values.dtype).at[rows, slot].add(jnp.where(first, values, 0.0), mode="drop")


def _check_turns(fn, turn_rewards, turn_mask):
  r = v.float_array(fn, "turn_rewards", turn_rewards)
  m = v.mask_array(fn, "turn_mask", turn_mask)
  v.check_rank(fn, "turn_rewards", r, 2, "[B, K]")
  v.check_shape(fn, "turn_mask", m, r.shape, "turn_rewards")
  return r * m, m


def _turn_returns(r: Array, gamma: float) -> Array:
  """float[B, K]: G_k = r_k + gamma * G_{k+1} (G after the last slot = 0)."""

  def step(g_next, r_k):
    g = r_k + gamma * g_next
    return g, g

  _, g = jax.lax.scan(step, jnp.zeros(r.shape[:1], r.dtype), r.T, reverse=True)
  return g.T


def turn_gae(
  turn_rewards: Array, turn_values: Array, turn_mask: Array, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Array, Array]:
  """GAE with turns as the time steps (see the module docstring).

  Args:
    turn_rewards: float[B, K]; turn_values: float[B, K] (the critic's value at each turn's start);
    turn_mask: bool/float[B, K], 1 on the row's turns (a prefix of the K slots).
  Returns:
    (advantages float[B, K], returns float[B, K]), 0 on absent turns. Not whitened.
  """
  fn = "turn_gae"
  r, m = _check_turns(fn, turn_rewards, turn_mask)
  vals = v.float_array(fn, "turn_values", turn_values)
  v.check_shape(fn, "turn_values", vals, r.shape, "turn_rewards")
  vals = vals * m

  def step(carry, xs):
    v_next, a_next = carry
    r_k, v_k, m_k = xs
    a = r_k + gamma * v_next - v_k + gamma * lam * a_next
    a = a * m_k
    return (v_k, a), a

  zeros = jnp.zeros(r.shape[:1], r.dtype)
  _, adv = jax.lax.scan(step, (zeros, zeros), (r.T, vals.T, m.T), reverse=True)
  adv = adv.T
  return adv, (adv + vals) * m


def gigpo(
  turn_rewards: Array,
  turn_mask: Array,
  group_ids: Array,
  anchor_ids: Array,
  *,
  gamma: float = 1.0,
  step_weight: float = 1.0,
  eps: float = 1e-6,
) -> Array:
  """GiGPO advantages per turn (see the module docstring).

  Args:
    turn_rewards: float[B, K] (the outcome already added to each row's last turn);
    turn_mask: bool/float[B, K]; group_ids: int[B] (rows answering one prompt);
    anchor_ids: int[B, K] in [0, B * K): equal ids = the same anchor state (the observation the
      turn acted on); only turns of one group are ever pooled, whatever their ids.
  Returns:
    float[B, K]: A^E + step_weight * A^S, 0 on absent turns.
  """
  fn = "gigpo"
  r, m = _check_turns(fn, turn_rewards, turn_mask)
  group_ids = v.int_array(fn, "group_ids", group_ids)
  anchor_ids = v.int_array(fn, "anchor_ids", anchor_ids)
  v.check_shape(fn, "group_ids", group_ids, r.shape[:1], "turn_rewards (first axis)")
  v.check_shape(fn, "anchor_ids", anchor_ids, r.shape, "turn_rewards")
  b, k = r.shape
  episode = adv_lib.grpo(r.sum(axis=1), group_ids, eps=eps)  # [B]
  g = _turn_returns(r, gamma)
  _, rank = jnp.unique(group_ids, return_inverse=True, size=b, fill_value=0)
  n = b * k
  key = rank.reshape(b, 1).astype(jnp.int32) * n + jnp.clip(anchor_ids, 0, n - 1).astype(jnp.int32)
  key = jnp.where(m > 0, key, -1 - jnp.arange(n, dtype=jnp.int32).reshape(b, k))  # absent turns: alone
  count, centred, std = adv_lib._group_stats(g.reshape(n), key.reshape(n))
  step = jnp.where(count > 1, centred / (std + eps), 0.0).reshape(b, k)
  return (episode[:, None] + step_weight * step) * m


def _with_outcome(turn_rewards: Array, scores: Array | None, n_turns: Array) -> Array:
  """turn_rewards [B, K] with each row's score [B] added to its last turn (row with no turn: dropped)."""
  if scores is None:
    return turn_rewards
  k = turn_rewards.shape[1]
  last = jax.nn.one_hot(n_turns - 1, k, dtype=turn_rewards.dtype)  # n_turns 0: all-zero row
  return turn_rewards + last * scores[:, None]


def _turn_inputs(name, mask, scores, turn_rewards):
  ids = turn_ids(mask)
  if turn_rewards is None:  # the outcome alone, on the last turn; K = the most runs T positions can hold
    turn_rewards = jnp.zeros((ids.shape[0], (ids.shape[1] + 1) // 2), jnp.float32)
  turn_rewards = v.float_array(name, "turn_rewards", turn_rewards)
  v.check_rank(name, "turn_rewards", turn_rewards, 2, "[B, K]")
  n_turns = ids.max(axis=1) + 1
  k = turn_rewards.shape[1]
  turn_mask = jnp.arange(k)[None, :] < n_turns[:, None]
  return ids, turn_mask, _with_outcome(turn_rewards, scores, n_turns)


def _turn_gae_tokens(*, mask, scores, turn_rewards, values, gamma, lam, **_):
  ids, turn_mask, r = _turn_inputs("turn_gae", mask, scores, turn_rewards)
  if values is None:
    raise ValueError("advantages.compute('turn_gae'): argument `values` is required (a critic)")
  tv = turn_first_values(v.float_array("turn_gae", "values", values), ids, r.shape[1])
  adv, ret = turn_gae(r, tv, turn_mask, gamma=gamma, lam=lam)
  tok_mask = v.mask_array("turn_gae", "mask", mask)
  return adv_lib.masked_whiten(turns_to_tokens(adv, ids), tok_mask), turns_to_tokens(ret, ids)


def _gigpo_tokens(*, mask, scores, group_ids, turn_rewards, anchor_ids, gamma, eps, step_weight=1.0, **_):
  ids, turn_mask, r = _turn_inputs("gigpo", mask, scores, turn_rewards)
  if group_ids is None:
    raise ValueError("advantages.compute('gigpo'): argument `group_ids` is required")
  if anchor_ids is None:  # no anchor states: the k-th turns of a group's chains form a step group
    anchor_ids = jnp.broadcast_to(jnp.arange(r.shape[1], dtype=jnp.int32), r.shape)
  adv = turns_to_tokens(gigpo(r, turn_mask, group_ids, anchor_ids, gamma=gamma, step_weight=step_weight, eps=eps), ids)
  return adv, adv


TURN_ESTIMATORS = ("turn_gae", "gigpo")  # need the turn arrays of rl/turn_rewards.py
adv_lib.register("turn_gae", turn_gae, _turn_gae_tokens)
adv_lib.register("gigpo", gigpo, _gigpo_tokens)
