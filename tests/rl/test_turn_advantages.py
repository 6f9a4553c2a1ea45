"""Turn-level estimators (rl/core/turn_advantages.py): hand-worked cases and float64 numpy loops on
fresh random inputs; through `advantages.compute` on token arrays (turns found from the mask)."""

import jax
import numpy as np
import pytest

from agentfly_jax.rl.core import advantages as A
from agentfly_jax.rl.core import turn_advantages as TA

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

S = 0.5**0.5  # the GRPO advantage of a two-member group


def ref_turn_gae(r, vals, m, gamma, lam):
  b, k = r.shape
  adv, ret = np.zeros((b, k)), np.zeros((b, k))
  for i in range(b):
    n = int(m[i].sum())
    a_next = 0.0
    for j in reversed(range(n)):
      v_next = vals[i, j + 1] if j + 1 < n else 0.0
      a_next = r[i, j] + gamma * v_next - vals[i, j] + gamma * lam * a_next
      adv[i, j], ret[i, j] = a_next, a_next + vals[i, j]
  return adv, ret


def ref_gigpo(r, m, gids, anchors, gamma, w, eps):
  b, k = r.shape
  n = [int(m[i].sum()) for i in range(b)]
  total = [sum(r[i, : n[i]]) for i in range(b)]
  ret = {(i, j): sum(gamma ** (q - j) * r[i, q] for q in range(j, n[i])) for i in range(b) for j in range(n[i])}

  def norm(x, xs, single):
    if len(xs) == 1:
      return single
    mean = sum(xs) / len(xs)
    std = (sum((u - mean) ** 2 for u in xs) / (len(xs) - 1)) ** 0.5
    return (x - mean) / (std + eps)

  out = np.zeros((b, k))
  for i in range(b):
    ep = norm(total[i], [total[q] for q in range(b) if gids[q] == gids[i]], total[i] / (1 + eps))
    for j in range(n[i]):
      members = [ret[q, p] for (q, p) in ret if gids[q] == gids[i] and anchors[q, p] == anchors[i, j]]
      out[i, j] = ep + w * norm(ret[i, j], members, 0.0)
  return out


def test_turn_gae_hand_worked():
  adv, ret = TA.turn_gae([[0.0, 1.0, 2.0]], [[0.5, 1.0, 0.0]], [[1, 1, 1]], gamma=0.5, lam=0.5)
  # k=2: delta 2 -> A 2; k=1: delta 1 + 0.5*0 - 1 = 0, A = 0.25 * 2 = 0.5; k=0: delta 0.5 - 0.5 = 0, A = 0.125
  np.testing.assert_allclose(adv, [[0.125, 0.5, 2.0]], atol=1e-6)
  np.testing.assert_allclose(ret, [[0.625, 1.5, 2.0]], atol=1e-6)
  # an absent third turn: its slot is 0 and nothing is bootstrapped from it
  adv, ret = TA.turn_gae([[0.0, 1.0, 9.0]], [[0.5, 1.0, 9.0]], [[1, 1, 0]], gamma=0.5, lam=0.5)
  np.testing.assert_allclose(adv, [[0.0 + 0.5 * 1 - 0.5 + 0.25 * 0.0, 0.0, 0.0]], atol=1e-6)
  np.testing.assert_allclose(ret, [[0.5, 1.0, 0.0]], atol=1e-6)


def test_gigpo_hand_worked_step_groups_stay_inside_their_group():
  r = [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [3.0, 0.0, 0.0]]
  m = [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
  anchors = [[0, 1, 0], [0, 1, 2], [0, 0, 0]]  # row 2 shares anchor 0, but it is another group
  out = TA.gigpo(r, m, np.array([0, 0, 1]), np.array(anchors), gamma=1.0, step_weight=1.0, eps=1e-6)
  # episode: returns 1, 2 in group 0 -> -S, +S; row 2 alone -> 3 / (1 + eps). Step: (g0, a0) {1, 2},
  # (g0, a1) {1, 2} -> -S, +S; (g0, a2) and (g1, a0) alone -> 0.
  np.testing.assert_allclose(out, [[-2 * S, -2 * S, 0], [2 * S, 2 * S, S], [3.0, 0, 0]], atol=1e-5)
  half = TA.gigpo(r, m, np.array([0, 0, 1]), np.array(anchors), step_weight=0.5)
  np.testing.assert_allclose(half[0, :2], [-1.5 * S, -1.5 * S], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_turn_estimators_match_float64_loops(seed):
  rng = np.random.default_rng(seed)
  b, k = 7, 5
  n = rng.integers(0, k + 1, b)
  m = (np.arange(k)[None] < n[:, None]).astype(np.float32)
  r = rng.normal(size=(b, k)).astype(np.float32)
  vals = rng.normal(size=(b, k)).astype(np.float32)
  gids = rng.integers(0, 3, b)
  anchors = rng.integers(0, 3, (b, k))
  gamma, lam = float(rng.uniform(0.5, 1)), float(rng.uniform(0.5, 1))
  adv, ret = jax.jit(lambda *a: TA.turn_gae(*a, gamma=gamma, lam=lam))(r, vals, m)
  want_adv, want_ret = ref_turn_gae(r.astype(np.float64) * m, vals * m, m, gamma, lam)
  np.testing.assert_allclose(adv, want_adv, atol=2e-5)
  np.testing.assert_allclose(ret, want_ret, atol=2e-5)
  got = jax.jit(lambda *a: TA.gigpo(*a, gamma=gamma, step_weight=0.7))(r, m, gids, anchors)
  np.testing.assert_allclose(got, ref_gigpo(r.astype(np.float64) * m, m, gids, anchors, gamma, 0.7, 1e-6), atol=5e-5)


def test_compute_maps_turns_to_tokens_and_adds_the_outcome_to_the_last_turn():
  mask = np.zeros((2, 10), bool)
  mask[0, [1, 2, 5]] = True  # row 0: turn 0 = tokens 1-2, turn 1 = token 5
  mask[1, [2, 3, 4]] = True  # row 1: one turn
  np.testing.assert_array_equal(TA.turn_ids(mask)[0], [-1, 0, 0, -1, -1, 1, -1, -1, -1, -1])
  args = dict(mask=mask, scores=np.array([1.0, 0.0]), group_ids=np.array([0, 0]))
  adv, ret = A.compute(
    "gigpo", **args, turn_rewards=np.array([[0.5, 0.0], [0.0, 7.0]]), anchor_ids=np.array([[0, 1], [0, 0]])
  )
  # turn rewards [0.5, 1] and [0] (row 1's second slot is no turn): episode +-S; step (a0) {1.5, 0} +-S
  want = np.zeros((2, 10))
  want[0, [1, 2]], want[0, 5], want[1, [2, 3, 4]] = 2 * S, S, -2 * S
  np.testing.assert_allclose(adv, want, atol=1e-5)
  np.testing.assert_allclose(ret, want, atol=1e-5)
  # turn_gae with values: V at each turn's first action token
  values = np.arange(20, dtype=np.float32).reshape(2, 10) / 10
  np.testing.assert_allclose(TA.turn_first_values(values, TA.turn_ids(mask), 2), [[0.1, 0.5], [1.2, 0.0]])
  adv, ret = A.compute("turn_gae", **args, values=values, turn_rewards=np.array([[0.5, 0.0], [0.0, 7.0]]))
  # row 0: A1 = 1 - 0.5 = 0.5, A0 = 0.5 + 0.5 - 0.1 + 0.5 = 1.4; row 1: A0 = 0 - 1.2
  raw = np.zeros((2, 10))
  raw[0, [1, 2]], raw[0, 5], raw[1, [2, 3, 4]] = 1.4, 0.5, -1.2
  np.testing.assert_allclose(adv, A.masked_whiten(raw, mask), atol=1e-5)
  ret_want = np.zeros((2, 10))
  ret_want[0, [1, 2]], ret_want[0, 5] = 1.5, 1.0
  np.testing.assert_allclose(ret, ret_want, atol=1e-5)  # row 1: A + V = -1.2 + 1.2 = 0
  # no turn rewards: the outcome alone on the last turn; no anchors: the k-th turns pooled
  adv, _ = A.compute("gigpo", **args)
  want = np.zeros((2, 10))  # turns [0, 1] vs [0]: episode +-S; step k=0 {1, 0} +-S, k=1 alone
  want[0, [1, 2]], want[0, 5], want[1, [2, 3, 4]] = 2 * S, S, -2 * S
  np.testing.assert_allclose(adv, want, atol=1e-5)
  with pytest.raises(ValueError, match="turn_rewards"):
    A.compute("gigpo", **args, turn_rewards=np.zeros(2))
