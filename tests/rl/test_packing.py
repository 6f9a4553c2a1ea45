"""Sequence packing: packed rows give the same per-token log-probs as the unpacked rows, and the
same train step (loss, updated params) for every aggregation mode and for GSPO and the critic;
the packer keeps every token, rejects bad input, and the model's attention never crosses a
segment (a changed token in one segment leaves the others' logits unchanged)."""

import numpy as np
import jax
import optax
import pytest
from flax import nnx

from agentfly_jax.models import CausalLM, Critic, tiny_config
from agentfly_jax.rl.batching import to_microbatches
from agentfly_jax.rl.packing import first_fit_decreasing, pack_batch, padding_fraction, unpack
from agentfly_jax.rl.core.train_state import create_train_state
from agentfly_jax.rl.core.train_step import make_train_step, policy_logprobs
from agentfly_jax.rl.programs import default_loss_config

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

N, T, V = 9, 24, 64


def _cfg(layers=2):
  return tiny_config(
    "llama",
    vocab_size=V,
    num_hidden_layers=layers,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=False,
  )


@pytest.fixture(scope="module")
def batch():
  """Target-aligned [N, T] (as rl.batching.train_arrays): input_ids[t] predicts target_ids[t]."""
  rng = np.random.default_rng(0)
  lengths = rng.integers(4, T + 1, size=N)
  lengths[0] = T
  attn = np.arange(T)[None] < lengths[:, None]
  action = attn & (rng.random((N, T)) < 0.6)
  action[:, :2] = False
  tokens = rng.integers(1, V, (N, T + 1)).astype(np.int32)
  ids, targets = np.where(attn, tokens[:, :-1], 0), np.where(attn, tokens[:, 1:], 0)
  f = lambda x: np.where(action, x, 0).astype(np.float32)  # noqa: E731
  return {
    "input_ids": ids,
    "target_ids": targets,
    "attention_mask": attn,
    "action_mask": action,
    "old_logprobs": f(-rng.random((N, T)) * 3),
    "advantages": f(rng.normal(size=(N, T))),
    "ref_logprobs": f(-rng.random((N, T)) * 3),
    "returns": f(rng.normal(size=(N, T))),
    "old_values": f(rng.normal(size=(N, T)) * 0.1),
  }


def test_pack_keeps_every_token_and_fewer_rows(batch):
  packed, layout = pack_batch(batch)
  assert layout.num_rows < N and packed["input_ids"].shape == (layout.num_rows, T)
  assert padding_fraction(packed["attention_mask"]) < padding_fraction(batch["attention_mask"])
  for k in batch:
    np.testing.assert_array_equal(unpack(packed[k], layout, T), batch[k])
  seg, pos = packed["segment_ids"], packed["positions"]
  assert ((seg > 0) == packed["attention_mask"]).all()
  np.testing.assert_array_equal(unpack(pos, layout, T), np.where(batch["attention_mask"], np.arange(T), 0))
  lay = first_fit_decreasing(np.array([5, 3, 4, 4]), 8)
  assert lay.num_rows == 2 and sorted(lay.row.tolist()) == [0, 0, 1, 1]


def test_pack_rejects_bad_input(batch):
  bad = dict(batch, attention_mask=batch["attention_mask"].copy())
  bad["attention_mask"][3, 0] = False
  with pytest.raises(ValueError, match="row 3 is not right-padded"):
    pack_batch(bad)
  with pytest.raises(ValueError, match="more than row_len=8"):
    pack_batch(batch, row_len=8)
  with pytest.raises(ValueError, match="field 'x'"):
    pack_batch(dict(batch, x=np.zeros(N)))


@pytest.mark.slow
def test_packed_logprobs_equal_unpacked_and_segments_are_isolated(batch):
  model = CausalLM(_cfg(), rngs=nnx.Rngs(0))
  packed, layout = pack_batch(batch)
  # one jitted program per (rows, segment ids?, positions?), not op by op
  logprobs = nnx.jit(lambda m, i, t, a, s, p: policy_logprobs(m, i, t, a, segment_ids=s, positions=p)[0])
  lp = lambda b: np.asarray(  # noqa: E731
    logprobs(model, b["input_ids"], b["target_ids"], b["attention_mask"], b.get("segment_ids"), b.get("positions"))
  )
  want = lp(batch)
  got = unpack(lp(packed), layout, T)
  am = batch["attention_mask"]
  np.testing.assert_allclose(got[am], want[am], rtol=1e-5, atol=1e-5)
  # without explicit positions the model derives them from the segment ids
  got2 = unpack(lp({k: v for k, v in packed.items() if k != "positions"}), layout, T)
  np.testing.assert_allclose(got2[am], want[am], rtol=1e-5, atol=1e-5)
  # change the last token of the row's first segment: the next segment's log-probs stay the same
  row = int(layout.row[np.argmax(np.bincount(layout.row) > 1)]) if (np.bincount(layout.row) > 1).any() else 0
  members = np.nonzero(layout.row == row)[0]
  first = members[np.argmin(layout.offset[members])]
  changed = {k: v.copy() for k, v in packed.items()}
  changed["input_ids"][row, layout.offset[first] + layout.length[first] - 1] += 1
  after = lp(changed)
  rest = packed["segment_ids"][row] > 1
  np.testing.assert_allclose(after[row, rest], lp(packed)[row, rest], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
  "policy,agg",
  [("ppo", "seq-mean-token-mean"), ("gspo", "seq-mean-token-sum-norm"), ("decoupled_ppo", "seq-mean-token-mean")],
)
def test_packed_train_step_equals_unpacked(batch, policy, agg):
  cfg = default_loss_config(
    policy_loss=policy,
    agg=agg,
    kl_coef=0.05,
    entropy_coef=0.01,
    logits_chunk=16,
    clip_low=3e-4 if policy == "gspo" else 0.2,
    clip_high=4e-4 if policy == "gspo" else 0.28,
    behaviour_cap=1.5,
  )
  if policy == "decoupled_ppo":  # the sampler's log-probs: some behaviour weights past the cap
    noise = np.random.default_rng(1).normal(size=batch["old_logprobs"].shape) * 0.5
    batch = {
      **batch,
      "behaviour_logprobs": np.where(batch["action_mask"], batch["old_logprobs"] + noise, 0).astype(np.float32),
    }
  packed, layout = pack_batch(batch)
  results = []
  for b in (batch, packed):
    # one layer: the loss and update over packed rows do not depend on depth (the two-layer model's
    # attention across segments is the log-prob test's), and a second layer only adds compile time
    model, critic = CausalLM(_cfg(1), rngs=nnx.Rngs(0)), Critic(_cfg(1), rngs=nnx.Rngs(1))
    g, p, r = nnx.split(model, nnx.Param, ...)
    cg, cp, cr = nnx.split(critic, nnx.Param, ...)
    opt = optax.sgd(0.1)
    state = create_train_state(p, opt, critic_params=cp, critic_optimizer=opt)
    step = jax.jit(make_train_step(g, r, opt, cfg, critic_graphdef=cg, critic_rest=cr, critic_optimizer=opt))
    rows = b["input_ids"].shape[0]
    state, m = step(state, to_microbatches(b, np.arange(rows), rows))
    results.append((state, m))
  (s0, m0), (s1, m1) = results
  keys = ["actor/pg_loss", "actor/entropy", "actor/kl_ref", "critic/vf_loss", "actor/loss_denom"]
  if policy == "decoupled_ppo":
    assert 0 < float(m0["actor/behaviour_capped_frac"]) < 1
    keys += ["actor/behaviour_weight_mean", "actor/behaviour_capped_frac"]
  for k in keys:
    np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, atol=1e-6, err_msg=k)
  for tree0, tree1 in ((s0.params, s1.params), (s0.critic_params, s1.critic_params)):
    for a, b_ in zip(jax.tree.leaves(tree0), jax.tree.leaves(tree1)):
      np.testing.assert_allclose(np.asarray(b_), np.asarray(a), rtol=1e-4, atol=1e-6)
