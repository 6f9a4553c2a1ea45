"""Router replay from the paged engine's recorded routes to the train step: a mixture-of-experts policy's
trajectories carry the engine's routes into the train arrays; replayed (`model.router_replay=rollout`),
prepare and the train step route every token as the sampler did, so the trainer's routing equals the recorded
one, while router/rollout_mismatch measures the trainer router's own choice against it: 0 on the sampler's
weights, > 0 once the weights moved (either mode)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.rl.batching import to_microbatches, train_arrays
from agentfly_jax.rl.core.prepare import make_prepare
from agentfly_jax.rl.core.train_state import create_train_state
from agentfly_jax.rl.core.train_step import make_train_step, policy_logprobs_entropy
from agentfly_jax.rl.programs import default_loss_config
from agentfly_jax.rl.update import default_prepare_config
from agentfly_jax.sampling import SamplingParams
from agentfly_jax.sampling.engine import PagedJaxSampler
from sampler_testing import make_model

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

# the engine and model of tests/sampling/test_moe_engine.py (its programs come from the compile cache)
ENGINE = dict(
  num_slots=2,
  max_len=64,
  page_size=4,
  kv_cache_pages=9,
  prefill_tokens=16,
  prefill_chunks=(16,),
  decode_steps=2,
  decode_batches=(2,),
  attention_block_pages=2,
)
PROMPTS = [[3, 17, 42, 8, 60, 11, 5], [90, 1, 33, 7]]


@pytest.fixture(scope="module")
def parts():
  """(model, the train arrays of two greedy chains the engine sampled from it, with their routes)."""
  model = make_model("qwen3_moe", seed=5)
  engine = PagedJaxSampler(model, **ENGINE)
  results = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))
  engine.close()
  trajs = []
  for i, (prompt, r) in enumerate(zip(PROMPTS, results)):
    n = len(prompt) + len(r.token_ids)
    trajs.append(
      Trajectory(
        token_ids=prompt + r.token_ids,
        action_mask=np.arange(n) >= len(prompt),
        sampler_logprobs=np.r_[np.zeros(len(prompt)), r.logprobs],
        reward=float(i),
        group_id=0,
        chain_id=i,
        routed_experts=r.routed_experts,
      )
    )
  return model, train_arrays(trajs, pad_id=0, multiple=16)


def _perturbed(params, scale: float = 2.0):
  """The params with the routers' kernels moved by noise (the weights a later step trains on)."""
  rng = np.random.default_rng(1)

  def move(path, x):
    if "gate" in jax.tree_util.keystr(path) and "experts" not in jax.tree_util.keystr(path):
      return x + jnp.asarray(rng.normal(0, scale * float(jnp.std(x)), x.shape), x.dtype)
    return x

  return jax.tree_util.tree_map_with_path(move, params)


_PROGRAMS = {}


def _programs(graphdef, rest):
  if not _PROGRAMS:
    opt = optax.sgd(0.0)
    _PROGRAMS["step"] = jax.jit(make_train_step(graphdef, rest, opt, default_loss_config(agg="token-mean")))
    _PROGRAMS["prepare"] = make_prepare(graphdef, rest, default_prepare_config("grpo", chunk=2))
    _PROGRAMS["routes"] = jax.jit(
      lambda params, ids, mask, routed: (
        policy_logprobs_entropy(
          nnx.merge(graphdef, params, rest), ids, ids, mask, routed_experts=routed, with_router=True
        )[2].experts
      )
    )
    _PROGRAMS["opt"] = opt
  return _PROGRAMS


def _update(model, params, arrays, replay: bool):
  """prepare + one train step on `params` with the sampler's routes replayed or only measured: (prepared
  batch, step metrics, the experts the trainer routed each input token to [B, L, Lm, k])."""
  graphdef, _, rest = nnx.split(model, nnx.Param, ...)
  progs = _programs(graphdef, rest)
  routes = arrays["rollout_experts"]
  host = {k: v for k, v in arrays.items() if k != "rollout_experts"}
  host["routed_experts" if replay else "rollout_experts"] = routes
  batch, _ = progs["prepare"](params, None, None, host)
  state = create_train_state(jax.tree.map(jnp.copy, params), progs["opt"])
  _, metrics = progs["step"](state, to_microbatches(jax.device_get(batch), np.arange(2), 2))
  replayed = jnp.moveaxis(routes, 2, 0) if replay else None  # [Lm, B, L, k]
  used = progs["routes"](params, jnp.asarray(arrays["input_ids"]), jnp.asarray(arrays["attention_mask"]), replayed)
  return batch, metrics, np.moveaxis(np.asarray(used), 0, 2)


@pytest.mark.slow
def test_replayed_routing_equals_the_recorded_and_the_mismatch_metric(parts):
  model, arrays = parts
  recorded = arrays["rollout_experts"]
  known = np.all(recorded >= 0, axis=(-2, -1))  # every input token of a chain but its padding
  assert known.sum() == sum(len(p) + 8 - 1 for p in PROMPTS)
  assert np.all(known[arrays["action_mask"]])  # every token that predicts a sampled one was recorded
  params = nnx.state(model, nnx.Param)

  def same(a, b):  # the same experts (in any order) at the recorded tokens
    return np.array_equal(np.sort(a, -1)[known], np.sort(b, -1)[known])

  # on the sampler's weights: the trainer's own routing is the recorded one, replayed or not
  for replay in (True, False):
    _, m, used = _update(model, params, arrays, replay)
    assert float(m["router/rollout_mismatch"]) == 0.0
    assert same(used, recorded)
    np.testing.assert_allclose(float(m["actor/ratio_mean"]), 1.0, atol=1e-5)
  # the weights moved: off, the trainer routes by its own router (the metric shows how far); on, by the
  # recorded routes, in prepare's old log-probs as in the step (the ratio stays 1)
  moved = _perturbed(params)
  off_batch, off, off_used = _update(model, moved, arrays, replay=False)
  on_batch, on, on_used = _update(model, moved, arrays, replay=True)
  assert float(off["router/rollout_mismatch"]) > 0.05 and float(on["router/rollout_mismatch"]) > 0.05
  assert not same(off_used, recorded) and same(on_used, recorded)
  np.testing.assert_allclose(float(on["actor/ratio_mean"]), 1.0, atol=1e-5)
  np.testing.assert_allclose(float(off["actor/ratio_mean"]), 1.0, atol=1e-5)
  mask = arrays["action_mask"]
  gap = np.abs(np.asarray(on_batch["old_logprobs"]) - np.asarray(off_batch["old_logprobs"]))[mask]
  assert gap.max() > 1e-3  # replaying changed the log-probs trained on


def test_train_arrays_carry_the_routes_of_the_fed_tokens():
  routes = np.arange(5 * 2 * 3).reshape(5, 2, 3).astype(np.int16)  # 5 fed tokens of a 6-token chain, Lm 2, k 3
  with_routes = Trajectory(
    token_ids=np.arange(6), action_mask=np.arange(6) >= 3, sampler_logprobs=np.zeros(6), routed_experts=routes
  )
  without = Trajectory(token_ids=np.arange(4), action_mask=np.arange(4) >= 2, sampler_logprobs=np.zeros(4))
  arrays = train_arrays([with_routes, without], pad_id=0, multiple=8)
  out = arrays["rollout_experts"]
  assert out.shape == (2, 8, 2, 3) and out.dtype == np.int32
  np.testing.assert_array_equal(out[0, :5], routes)
  assert np.all(out[0, 5:] == -1) and np.all(out[1] == -1)  # not recorded: the trainer's router decides
  assert "rollout_experts" not in train_arrays([without], pad_id=0)
  with pytest.raises(ValueError, match=r"routed_experts must be \[n < 6, Lm, k\]"):
    Trajectory(
      token_ids=np.arange(6), action_mask=np.zeros(6), sampler_logprobs=np.zeros(6), routed_experts=np.zeros((6, 2, 3))
    )
