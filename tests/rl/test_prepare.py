"""The one jitted prepare: trainer/reference log-probs and critic values equal an independent
per-trajectory forward on the unshifted tokens (float64 log-softmax in numpy), advantages equal
the estimator on those values, and the shift of `train_arrays` is the next token."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.models import CausalLM, Critic, tiny_config
from agentfly_jax.rl.core import advantages as adv_lib
from agentfly_jax.rl.batching import overlong_penalty, pad_rows, train_arrays
from agentfly_jax.rl.core.prepare import chunked_rows, make_prepare
from agentfly_jax.rl.update import default_prepare_config

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

V = 64
CFG = dict(
  vocab_size=V, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16
)


def _trajs(rng, groups=3, chains=3):
  out = []
  for g in range(groups):
    for c in range(chains):
      n = int(rng.integers(8, 30))
      mask = np.zeros(n, bool)
      prompt = int(rng.integers(3, 6))
      mask[prompt:] = rng.random(n - prompt) < 0.7
      lp = np.where(mask, -rng.random(n) * 2, 0).astype(np.float32)
      out.append(
        Trajectory(
          token_ids=rng.integers(0, V, n).astype(np.int32),
          action_mask=mask,
          sampler_logprobs=lp,
          reward=float(rng.random() < 0.5),
          group_id=g,
          chain_id=c,
        )
      )
  return out


def _split(model):
  return nnx.split(model, nnx.Param, ...)


REF_LEN = 32  # every trajectory's forward at one shape: one compile, not one per length


@nnx.jit
def _forward(model, ids, mask):
  return model(ids, attention_mask=mask)


def _trajectory_forward(model, token_ids):
  """The model's output at each of `token_ids`' positions, from a forward of this trajectory alone
  (right-padded to REF_LEN with masked keys, which no earlier position attends to)."""
  n = len(token_ids)
  ids = np.zeros((1, REF_LEN), np.int32)
  ids[0, :n] = token_ids
  return np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(np.arange(REF_LEN)[None] < n)))[0, :n]


def _ref_logprobs(model, traj, temperature):
  """log p(token t | tokens < t) for t >= 1 from this trajectory's own forward, float64 softmax."""
  logits = np.asarray(_trajectory_forward(model, traj.token_ids[:-1]), np.float64) / temperature
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  return logits[np.arange(len(traj.token_ids) - 1), traj.token_ids[1:]] - logz


@pytest.mark.slow
@pytest.mark.parametrize("estimator,chunk,logits_chunk", [("grpo", 4, 0), ("gae", 3, 5)])
def test_prepare_matches_per_trajectory_reference(estimator, chunk, logits_chunk):
  """logits_chunk 0: plain [chunk, L, V] logits; 5: the chunked log-prob scan (5 does not divide
  the 3 x 32 tokens of a row chunk)."""
  rng = np.random.default_rng(abs(hash(estimator)) % 2**31)
  trajs = _trajs(rng)
  policy = CausalLM(tiny_config("qwen2", **CFG), rngs=nnx.Rngs(0))
  ref = CausalLM(tiny_config("qwen2", **CFG), rngs=nnx.Rngs(1))
  critic = Critic(tiny_config("qwen2", **CFG), rngs=nnx.Rngs(2)) if estimator == "gae" else None
  g, p, r = _split(policy)
  cg = cp = cr = None
  if critic is not None:
    cg, cp, cr = _split(critic)
  cfg = default_prepare_config(
    estimator=estimator,
    chunk=chunk,
    logits_chunk=logits_chunk,
    temperature=0.7,
    tis_cap=1.5,
    overlong_max_tokens=20,
    overlong_buffer=8,
    overlong_factor=0.5,
  )
  prepare = make_prepare(g, r, cfg, critic_graphdef=cg, critic_rest=cr)
  # REF_LEN columns whatever the drawn lengths (< 30 tokens), so the width check below holds on every seed
  arrays = pad_rows(train_arrays(trajs, pad_id=0, length=REF_LEN), 4)  # 9 rows + 3 inert ones
  batch, metrics = jax.device_get(prepare(p, _split(ref)[1], cp, arrays))
  n = len(trajs)
  assert batch["old_logprobs"].shape == arrays["input_ids"].shape and arrays["input_ids"].shape[1] == REF_LEN

  mask = arrays["action_mask"][:n]
  deltas = []
  for i, t in enumerate(trajs):
    L = len(t.token_ids) - 1
    np.testing.assert_array_equal(arrays["target_ids"][i, :L], t.token_ids[1:])  # the shift
    np.testing.assert_array_equal(mask[i, :L], t.action_mask[1:])
    m = t.action_mask[1:]
    old = _ref_logprobs(policy, t, 0.7)
    np.testing.assert_allclose(batch["old_logprobs"][i, :L][m], old[m], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(batch["ref_logprobs"][i, :L][m], _ref_logprobs(ref, t, 0.7)[m], rtol=1e-4, atol=1e-4)
    assert not batch["old_logprobs"][i][~mask[i]].any()
    w = np.minimum(np.exp(old - t.sampler_logprobs[1:]), 1.5)
    np.testing.assert_allclose(batch["is_weights"][i, :L][m], w[m], rtol=1e-3, atol=1e-4)
    deltas.append(old[m] - t.sampler_logprobs[1:][m])
  deltas = np.concatenate(deltas)
  assert metrics["mismatch/mean_abs_diff"] == pytest.approx(np.abs(deltas).mean(), rel=1e-3)
  assert metrics["mismatch/num_tokens"] == mask.sum()

  gen = mask.sum(1)
  pen = overlong_penalty(gen, max_tokens=20, buffer=8, factor=0.5)
  assert metrics["dapo/overlong_penalty_mean"] == pytest.approx(pen.mean(), rel=1e-5, abs=1e-7)
  values = None
  if critic is not None:
    values = np.zeros(mask.shape, np.float32)
    for i, t in enumerate(trajs):
      L = len(t.token_ids) - 1
      values[i, :L] = _trajectory_forward(critic, t.token_ids[:-1])
    values = np.where(mask, values, 0)
    np.testing.assert_allclose(batch["old_values"][:n], values, rtol=1e-4, atol=1e-4)
  adv, ret = adv_lib.compute(
    estimator, mask=mask, scores=arrays["rewards"][:n] + pen, group_ids=arrays["group_ids"][:n], values=values
  )
  np.testing.assert_allclose(batch["advantages"][:n], np.asarray(adv), rtol=1e-4, atol=1e-4)
  assert not batch["advantages"][n:].any()  # inert padding rows
  if critic is not None:
    np.testing.assert_allclose(batch["returns"][:n], np.asarray(ret), rtol=1e-4, atol=1e-4)
  assert metrics["adv/abs_mean"] == pytest.approx(np.abs(np.asarray(adv))[mask].mean(), rel=1e-4)


def test_chunked_rows_pads_and_slices():
  x = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
  got = jax.jit(lambda a: chunked_rows(lambda c: c * 2 + c.sum(1, keepdims=True), 3, a))(x)
  np.testing.assert_allclose(got, x * 2 + x.sum(1, keepdims=True), rtol=1e-6)
