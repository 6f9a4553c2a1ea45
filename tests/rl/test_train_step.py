"""The jitted train step: micro-batch accumulation equals the full batch exactly, the update
equals an independent gradient of the global-mean loss, PPO's critic trains, SFT lowers NLL."""

import numpy as np
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from agentfly_jax.models import CausalLM, Critic, make_mesh, partition_specs, tiny_config
from agentfly_jax.rl.core import losses
from agentfly_jax.rl.batching import to_microbatches
from agentfly_jax.rl.core.train_state import create_train_state
from agentfly_jax.rl.core.train_step import (
  batch_sharding,
  jit_step,
  make_sft_step,
  make_train_step,
  policy_logprobs,
  state_shardings,
)
from agentfly_jax.rl.programs import default_loss_config

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

B, T, V = 8, 24, 64


# One decoder layer: the step's accumulation, loss and update do not depend on the depth, and a
# second layer only adds compile time (XLA compiles dominate this file).
CONFIG = tiny_config(
  "qwen2",
  vocab_size=V,
  hidden_size=64,
  intermediate_size=128,
  num_hidden_layers=1,
  num_attention_heads=2,
  num_key_value_heads=1,
)


def _model(seed=0):
  return CausalLM(CONFIG, rngs=nnx.Rngs(seed))


def _loss_config(agg):
  return default_loss_config(agg=agg, kl_coef=0.05, entropy_coef=0.01, clip_high=0.28)


_STEPS = {}


def _plain_step(graphdef, rest, cfg, lr):
  """The jitted train step of `cfg` under SGD(lr), built once per (cfg, lr): every test that runs the
  same loss on the same shapes reuses its compiled program."""
  if (cfg, lr) not in _STEPS:
    opt = optax.sgd(lr)
    _STEPS[cfg, lr] = (opt, jax.jit(make_train_step(graphdef, rest, opt, cfg)))
  return _STEPS[cfg, lr]


def _batch(rng):
  """A target-aligned batch [B, T]: input_ids[t] predicts target_ids[t] = token t+1."""
  ids = rng.integers(0, V, size=(B, T + 1)).astype(np.int32)
  lengths = rng.integers(T // 2, T + 1, size=B)
  attn = np.arange(T)[None] < lengths[:, None]
  action = attn & (rng.random((B, T)) < 0.6)
  action[:, :2] = False
  action[5] = False  # an all-masked row
  old = np.where(action, -rng.random((B, T)) * 3, 0).astype(np.float32)
  adv = np.where(action, rng.normal(size=(B, T)), 0).astype(np.float32)
  ref = np.where(action, -rng.random((B, T)) * 3, 0).astype(np.float32)
  return {
    "input_ids": ids[:, :-1],
    "target_ids": ids[:, 1:],
    "attention_mask": attn,
    "action_mask": action,
    "old_logprobs": old,
    "advantages": adv,
    "ref_logprobs": ref,
  }


def _run(cfg, batch, micro, seed=0, steps=1, lr=0.1):
  model = _model(seed)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt, step = _plain_step(graphdef, rest, cfg, lr)
  state = create_train_state(params, opt)
  mb = to_microbatches(batch, np.arange(B), micro)
  for _ in range(steps):
    state, metrics = step(state, mb)
  return state, metrics, (graphdef, params, rest)


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_microbatching_equals_full_batch_and_reference_gradient(agg):
  rng = np.random.default_rng(abs(hash(agg)) % 2**31)
  batch = _batch(rng)
  cfg = _loss_config(agg)
  full, m_full, (graphdef, params0, rest) = _run(cfg, batch, micro=B)
  micro, m_micro, _ = _run(cfg, batch, micro=2)
  for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(micro.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)

  # Independent reference: grad of the global-mean loss over the whole batch, one call.
  def mean_loss(p):
    model = nnx.merge(graphdef, p, rest)
    lp, logits = policy_logprobs(
      model, jnp.asarray(batch["input_ids"]), jnp.asarray(batch["target_ids"]), jnp.asarray(batch["attention_mask"])
    )
    mask = jnp.asarray(batch["action_mask"])
    s, d, _ = losses.policy_loss(
      lp, jnp.asarray(batch["old_logprobs"]), jnp.asarray(batch["advantages"]), mask, clip_high=0.28, agg=agg
    )
    kl = losses.kl_penalty(lp, jnp.asarray(batch["ref_logprobs"]), kind="k3")
    ks, _ = losses.aggregate(kl, mask, agg)
    es, _ = losses.aggregate(losses.entropy_from_logits(logits), mask, agg)
    return (s + 0.05 * ks - 0.01 * es) / d

  grads = jax.jit(jax.grad(mean_loss))(params0)  # one program, not op by op
  expected = jax.tree.map(lambda p, g: p - 0.1 * g, params0, grads)
  for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
  assert np.isfinite(float(m_full["actor/pg_loss"]))
  assert abs(float(m_full["actor/pg_loss"]) - float(m_micro["actor/pg_loss"])) < 1.0  # averaged per micro


@pytest.mark.slow
def test_sharded_jit_with_donation_matches_plain_jit():
  rng = np.random.default_rng(7)
  batch = _batch(rng)
  cfg = _loss_config("token-mean")  # the plain step of the token-mean micro-batching case: compiled once
  expected, _, _ = _run(cfg, batch, micro=2, steps=2)
  model = _model(0)
  mesh = make_mesh(1, 1)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt = optax.sgd(0.1)
  state = create_train_state(params, opt)
  sh = state_shardings(state, mesh, partition_specs(model, mesh), optimizer=opt)
  state = jax.device_put(state, sh)
  mb = to_microbatches(batch, np.arange(B), 2)
  step = jit_step(make_train_step(graphdef, rest, opt, cfg), sh, batch_sharding(mesh, mb))
  old_leaf = jax.tree.leaves(state.params)[0]
  for _ in range(2):
    state, _ = step(state, mb)
  assert old_leaf.is_deleted()  # the state was donated
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert int(state.step) == 2


def test_ppo_critic_learns_returns():
  rng = np.random.default_rng(3)
  batch = _batch(rng)
  returns = np.where(batch["action_mask"], rng.normal(size=(B, T)), 0).astype(np.float32)
  batch.update(returns=returns, old_values=np.zeros((B, T), np.float32))
  model, critic = (
    _model(0),
    Critic(CONFIG, rngs=nnx.Rngs(1)),
  )
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  cg, cp, cr = nnx.split(critic, nnx.Param, ...)
  opt, copt = optax.sgd(0.0), optax.adam(3e-3)
  state = create_train_state(params, opt, critic_params=cp, critic_optimizer=copt)
  step = jax.jit(
    make_train_step(
      graphdef,
      rest,
      opt,
      default_loss_config(agg="token-mean", value_clip=100.0),
      critic_graphdef=cg,
      critic_rest=cr,
      critic_optimizer=copt,
    )
  )
  mb = to_microbatches(batch, np.arange(B), 4)
  first = None
  for _ in range(40):
    state, m = step(state, mb)
    first = first if first is not None else float(m["critic/vf_loss"])
  assert float(m["critic/vf_loss"]) < 0.5 * first


def test_sft_step_lowers_masked_nll():
  rng = np.random.default_rng(11)
  batch = _batch(rng)
  model = _model(0)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt = optax.adam(3e-3)
  state = create_train_state(params, opt)
  step = jax.jit(make_sft_step(graphdef, rest, opt))
  mb = to_microbatches(
    {k: batch[k] for k in ("input_ids", "target_ids", "attention_mask", "action_mask")}, np.arange(B), 4
  )
  state, m0 = step(state, mb)
  for _ in range(30):
    state, m = step(state, mb)
  assert float(m["sft/nll"]) < 0.5 * float(m0["sft/nll"])


def test_sft_step_chunked_at_action_tokens_equals_plain_logits():
  """The SFT step's default route (chunked log-probs, only at action tokens) gives the update of
  the plain [B, L, V] logits route, on a random batch, with micro-batches."""
  batch = {
    k: v
    for k, v in _batch(np.random.default_rng(12)).items()
    if k in ("input_ids", "target_ids", "attention_mask", "action_mask")
  }
  batch["action_mask"] = batch["action_mask"] & (np.arange(T)[None] % 3 == 0)  # sparse: the compact route
  mb = to_microbatches(batch, np.arange(B), 4)
  out = []
  for chunk in (0, 256):
    graphdef, params, rest = nnx.split(_model(0), nnx.Param, ...)
    opt = optax.sgd(0.5)
    state, m = jax.jit(make_sft_step(graphdef, rest, opt, logits_chunk=chunk))(create_train_state(params, opt), mb)
    out.append((state, m))
  (plain, m0), (chunked, m1) = out
  np.testing.assert_allclose(float(m1["sft/nll"]), float(m0["sft/nll"]), rtol=1e-5)
  moved = 0.0
  for a, b, p0 in zip(
    jax.tree.leaves(chunked.params),
    jax.tree.leaves(plain.params),
    jax.tree.leaves(nnx.split(_model(0), nnx.Param, ...)[1]),
  ):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    moved = max(moved, float(jnp.abs(b - p0).max()))
  assert moved > 1e-3


@pytest.mark.slow
@pytest.mark.eight_devices("train_step")
def test_train_step_on_8_fake_devices_matches_one_device(eight_device_check):
  """tests/multidevice_train_check.py, in the test run's 8-device child process."""
  assert eight_device_check["ok"] and "OK" in eight_device_check["output"], eight_device_check["output"]
