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
    (
      {"model.family": "qwen3_moe", "model.lora.rank": 4, "rollout.sampler": "vllm"},
      (
        r"config.rollout.sampler='vllm': vLLM does not serve LoRA adapters on a mixture-of-experts policy "
        r"\(model.lora.rank=4, model.family='qwen3_moe'.*rollout.sampler='jax' serves MoE LoRA"
      ),
    ),
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


def test_vllm_lora_refusal_reads_a_pretrained_policy_s_family(tmp_path):
  """A pretrained folder's config.json decides: a qwen3_moe folder with LoRA on vLLM is refused by name, a dense
  one is served; the JAX sampler takes LoRA on either, vLLM the MoE without LoRA."""
  import json

  from agentfly_jax.models import tiny_config

  folders = {}
  for family in ("qwen3_moe", "qwen3"):
    folders[family] = tmp_path / family
    folders[family].mkdir()
    (folders[family] / "config.json").write_text(json.dumps(tiny_config(family).to_hf_dict()))
  moe = {"model.pretrained": str(folders["qwen3_moe"]), "model.lora.rank": 8}
  with pytest.raises(
    ValueError, match=r"config.rollout.sampler='vllm': .*model.pretrained='.*qwen3_moe' is a qwen3_moe"
  ):
    _spec(**moe, **{"rollout.sampler": "vllm"})
  assert _spec(**moe, **{"rollout.sampler": "jax"}).model.lora.rank == 8
  assert _spec(**{**moe, "model.lora.rank": 0, "rollout.sampler": "vllm"}).rollout.sampler == "vllm"
  dense = {"model.pretrained": str(folders["qwen3"]), "model.lora.rank": 8, "rollout.sampler": "vllm"}
  assert _spec(**dense).rollout.sampler == "vllm"
  assert _spec(**{"model.family": "qwen3", "model.lora.rank": 8, "rollout.sampler": "vllm"}).model.lora.rank == 8
