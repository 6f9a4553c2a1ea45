"""The train step with a mixture-of-experts policy: the router's load-balancing term
(`loss.router_aux_coef`, HF's load_balancing_loss_func), router metrics, replayed routes."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from agentfly_jax.models import CausalLM, tiny_config  # noqa: E402
from agentfly_jax.rl.batching import to_microbatches  # noqa: E402
from agentfly_jax.rl.core.train_state import create_train_state  # noqa: E402
from agentfly_jax.rl.core.train_step import make_train_step  # noqa: E402
from agentfly_jax.rl.programs import default_loss_config  # noqa: E402

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

B, T, V = 4, 12, 64
CFG = tiny_config("qwen3_moe", vocab_size=V, hidden_size=64, head_dim=16, intermediate_size=96)


def _batch(rng):
  ids = rng.integers(0, V, size=(B, T + 1)).astype(np.int32)
  attn = np.arange(T)[None] < rng.integers(T // 2, T + 1, size=B)[:, None]
  action = attn & (rng.random((B, T)) < 0.7)
  return {
    "input_ids": ids[:, :-1],
    "target_ids": ids[:, 1:],
    "attention_mask": attn,
    "action_mask": action,
    "old_logprobs": np.where(action, -rng.random((B, T)) * 3, 0).astype(np.float32),
    "advantages": np.where(action, rng.normal(size=(B, T)), 0).astype(np.float32),
  }


@pytest.fixture(scope="module")
def parts():
  model = CausalLM(CFG, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return graphdef, params, rest, _batch(np.random.default_rng(0))


_STEPS = {}


def _step(parts, coef, batch=None):
  graphdef, params, rest, b = parts
  b = b if batch is None else batch
  opt = optax.sgd(0.1)
  state = create_train_state(jax.tree.map(jnp.copy, params), opt)
  if coef not in _STEPS:  # one jitted step per coefficient (a new batch key set retraces it)
    _STEPS[coef] = jax.jit(
      make_train_step(graphdef, rest, opt, default_loss_config(router_aux_coef=coef, agg="token-mean"))
    )
  return _STEPS[coef](state, to_microbatches(b, np.arange(B), 2))


def test_router_metrics_and_hf_aux_loss(parts):
  from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

  graphdef, params, rest, batch = parts
  _, metrics = _step(parts, 0.0)
  assert float(metrics["router/dropped_tokens"]) == 0.0
  assert float(metrics["router/expert_load_max"]) >= 1.0 >= float(metrics["router/expert_load_min"])
  # Reference: HF's function on our router logits, per micro-batch (rows 0-1, 2-3), averaged.
  model = nnx.merge(graphdef, params, rest)
  refs = []
  for rows in (slice(0, 2), slice(2, 4)):
    _, _, routes = model.hidden_states(
      jnp.asarray(batch["input_ids"][rows]), attention_mask=jnp.asarray(batch["attention_mask"][rows]), with_router=True
    )
    n = routes.logits.shape[1] * routes.logits.shape[2]
    refs.append(
      float(
        load_balancing_loss_func(
          tuple(torch.as_tensor(np.asarray(l).reshape(n, -1)) for l in routes.logits),
          CFG.num_experts,
          CFG.num_experts_per_tok,
          torch.as_tensor(batch["attention_mask"][rows], dtype=torch.long),
        )
      )
    )
  np.testing.assert_allclose(float(metrics["router/aux_loss"]), np.mean(refs), rtol=1e-4)


@pytest.mark.slow
def test_aux_coef_trains_only_through_the_router_term(parts):
  s0, m0 = _step(parts, 0.0)
  s1, m1 = _step(parts, 0.5)
  np.testing.assert_allclose(float(m1["actor/pg_loss"]), float(m0["actor/pg_loss"]), rtol=1e-6)
  gate0 = np.asarray(s0.params["model"]["layers"][0]["mlp"]["gate"]["kernel"][...])
  gate1 = np.asarray(s1.params["model"]["layers"][0]["mlp"]["gate"]["kernel"][...])
  assert np.abs(gate1 - gate0).max() > 1e-6  # the balancing term moves the router
  emb0 = np.asarray(s0.params["model"]["embed_tokens"]["embedding"][...])
  emb1 = np.asarray(s1.params["model"]["embed_tokens"]["embedding"][...])
  assert np.abs(emb1 - emb0).max() > 0  # and what feeds it


@pytest.mark.slow
def test_replayed_routes_are_used_and_measured(parts):
  graphdef, params, rest, batch = parts
  model = nnx.merge(graphdef, params, rest)
  _, _, routes = model.hidden_states(
    jnp.asarray(batch["input_ids"]), attention_mask=jnp.asarray(batch["attention_mask"]), with_router=True
  )
  own = np.moveaxis(np.asarray(routes.experts), 0, 2)  # [B, T, Lm, k]
  _, m_own = _step(parts, 0.0, {**batch, "routed_experts": own})
  assert float(m_own["router/rollout_mismatch"]) == 0.0
  other = (own + 3) % CFG.num_experts
  _, m_other = _step(parts, 0.0, {**batch, "routed_experts": other})
  _, m_measured = _step(parts, 0.0, {**batch, "rollout_experts": other})
  # the trainer's own top-k (3 off every replayed expert in the first layer; later layers see the
  # replayed layers' outputs) against the recorded routes
  assert float(m_other["router/rollout_mismatch"]) > 0.5 and float(m_measured["router/rollout_mismatch"]) > 0.5
  # replaying other experts changes the log-probs (measured-only does not)
  _, m_plain = _step(parts, 0.0)
  assert float(m_measured["actor/pg_loss"]) == pytest.approx(float(m_plain["actor/pg_loss"]), rel=1e-6)
  assert abs(float(m_other["actor/pg_loss"]) - float(m_plain["actor/pg_loss"])) > 1e-6
