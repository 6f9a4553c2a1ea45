"""Mixture-of-experts fields of the run config: each bad value named with what is allowed; the
random-init qwen3_moe policy is built from config.model's expert fields."""

import pytest

from agentfly_jax.rl.config import default_config
from agentfly_jax.rl.programs import loss_config
from agentfly_jax.rl.spec import RunSpec


def _spec(**fields):
  c = default_config()
  for name, value in fields.items():
    node = c
    *parts, key = name.split(".")
    for p in parts:
      node = node[p]
    node[key] = value
  return RunSpec.from_config(c)


@pytest.mark.parametrize(
  "fields, match",
  [
    ({"mesh.expert": 3, "model.family": "qwen3_moe"}, r"config.mesh.expert=3: .*divide model.num_experts=8"),
    (
      {"model.router_replay": "rollout", "rollout.sampler": "jax_static"},
      r"config.model.router_replay='rollout': .*rollout.sampler='jax_static' records none",
    ),
    (
      {"model.router_replay": "rollout", "rollout.sampler": "vllm"},
      r"config.model.router_replay='rollout': .*rollout.sampler='vllm' records none",
    ),
    ({"model.router_replay": "always"}, r"config.model.router_replay='always': must be one of \('off', 'rollout'\)"),
    ({"loss.router_aux_coef": -0.1}, r"config.loss.router_aux_coef=-0.1: must be >= 0"),
    ({"model.num_experts_per_tok": 9}, r"config.model.num_experts_per_tok=9: must be <= num_experts"),
  ],
)
def test_bad_moe_fields_are_named(fields, match):
  with pytest.raises(ValueError, match=match):
    _spec(**fields)


def test_moe_policy_config_and_loss_term():
  from agentfly_jax.rl.setup import model_config

  spec = _spec(**{"model.family": "qwen3_moe", "model.num_experts": 4, "loss.router_aux_coef": 0.01, "mesh.expert": 2})
  cfg = model_config(spec, 256)
  assert cfg.model_type == "qwen3_moe" and cfg.num_experts == 4 and cfg.moe_layers == (0, 1)
  assert loss_config(spec).router_aux_coef == 0.01
  assert loss_config(_spec()).router_aux_coef == 0.0
  # the paged engine (rollout.sampler=jax, the default) records each token's routes: replay is allowed
  assert _spec(**{"model.family": "qwen3_moe", "model.router_replay": "rollout"}).model.router_replay == "rollout"
