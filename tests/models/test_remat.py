"""Selectable remat policy per decoder layer (models/remat.py, config.train.remat): every policy
gives the loss and gradients of no remat on random inputs; the policy reaches the compiled
program; bad names are clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentfly_jax.models import CausalLM, tiny_config
from agentfly_jax.models.remat import remat_name, remat_policies

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.fixture(scope="module")
def problem():
  cfg = tiny_config("qwen3", vocab_size=64, attention_bias=True)
  model = CausalLM(cfg, rngs=nnx.Rngs(3))
  graphdef, params = nnx.split(model)
  # random (not initial) params: every weight, norm scales included, away from its init value
  keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(params))))
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), params)
  rng = np.random.default_rng(2)
  ids = jnp.asarray(rng.integers(0, 64, (3, 11)), jnp.int32)
  targets = jnp.asarray(rng.integers(0, 64, (3, 11)), jnp.int32)
  weights = jnp.asarray(rng.random((3, 11)), jnp.float32)
  reference = jax.jit(jax.value_and_grad(_loss_fn(cfg, "none", ids, targets, weights)))(params)
  return cfg, params, ids, targets, weights, reference


def _loss_fn(cfg, remat, ids, targets, weights):
  graphdef = nnx.graphdef(CausalLM(cfg.replace(remat=remat), rngs=nnx.Rngs(0)))

  def loss(params):
    logp = jax.nn.log_softmax(nnx.merge(graphdef, params)(ids))
    return -jnp.sum(jnp.take_along_axis(logp, targets[..., None], -1)[..., 0] * weights) / jnp.sum(weights)

  return loss


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "dots_saveable", "dots_with_no_batch_dims_saveable"])
def test_policy_gives_the_loss_and_grads_of_no_remat(problem, policy):
  cfg, params, ids, targets, weights, (l0, g0) = problem
  loss = _loss_fn(cfg, policy, ids, targets, weights)
  l1, g1 = jax.jit(jax.value_and_grad(loss))(params)
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  flat0, flat1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
  assert len(flat0) == len(flat1) and all(float(jnp.abs(g).max()) > 0 for g in flat0)
  for a, b in zip(flat0, flat1):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-7)
  # one checkpoint per decoder layer, with the named policy (jax.checkpoint's default for "full")
  found = _checkpoint_policies(jax.make_jaxpr(loss)(params).jaxpr)
  want = None if policy in ("full", True) else getattr(jax.checkpoint_policies, policy)
  assert found == [want] * cfg.num_hidden_layers, found


def _checkpoint_policies(jaxpr) -> list:
  """The `policy` of every checkpoint (remat) equation in `jaxpr`, nested jaxprs included."""
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("checkpoint", "remat", "remat2"):
      out.append(eqn.params.get("policy"))
    for v in eqn.params.values():
      for sub in v if isinstance(v, (list, tuple)) else [v]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          out += _checkpoint_policies(inner)
  return out


def test_no_remat_has_no_checkpoint(problem):
  cfg, params, ids, targets, weights, _ = problem
  assert _checkpoint_policies(jax.make_jaxpr(_loss_fn(cfg, "none", ids, targets, weights))(params).jaxpr) == []


def test_names_and_errors():
  assert remat_name(False) == remat_name("") == "none" and remat_name(True) == "full"
  policies = remat_policies()
  assert {"none", "full", "dots_saveable", "nothing_saveable"} <= set(policies)
  assert "save_only_these_names" not in policies  # a factory: needs names, not a policy by itself
  with pytest.raises(ValueError, match="unknown remat policy 'dots'; known: .*dots_saveable"):
    remat_name("dots")
  with pytest.raises(ValueError, match="ModelConfig.remat: unknown remat policy"):
    tiny_config("qwen2", remat="save_only_these_names")
  from agentfly_jax.rl.config import default_config, validate_config

  c = default_config()
  assert validate_config(c).remat is False
  saved = c.to_dict()
  saved["model"]["remat"] = True  # a config.json saved with the legacy bool: migrated to train.remat
  assert validate_config(saved).remat == "full" and validate_config(saved).train.remat == "full"
  assert saved["model"]["remat"] is True  # (the caller's dict left as it was)
  saved["model"]["remat"] = "full"
  with pytest.raises(ValueError, match="config.model.remat='full': legacy field: a bool"):
    validate_config(saved)
  c.train.remat = "dots_saveable"
  assert validate_config(c).remat == "dots_saveable"
  c.train.remat = "dot_saveable"
  with pytest.raises(ValueError, match=r"config.train.remat='dot_saveable': unknown remat policy"):
    validate_config(c)
