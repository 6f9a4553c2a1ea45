"""Sharding by logical axis names + rules: the models' params carry names, models/sharding.py maps
them with rules (config.mesh.rules). 8 fake CPU devices in a subprocess: 2x4 and 4x2 (fsdp, tp)
meshes equal one device, each param's sharding equals the written-out table
(tests/sharding_check.py), and a new module is sharded by its names alone."""

import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from agentfly_jax.models import (
  DEFAULT_RULES,
  CausalLM,
  Critic,
  make_mesh,
  param_with_axes,
  partition_specs,
  set_kernel_layout,
  shard_model,
  spec_for_axes,
  tiny_config,
)
from agentfly_jax.models.sharding import logical_axes


class FakeMesh:
  shape = {"fsdp": 2, "tp": 4}


def _path_rule(names) -> tuple:
  """The path-based rules the models were sharded by before logical names (written out here,
  independently of models/sharding.py): the names must reproduce them exactly."""
  leaf, owner = names[-1], names[-2]
  if leaf == "embedding":
    return ("tp", "fsdp")
  if leaf == "scale":
    return (None,)
  if owner in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head"):
    return ("fsdp", "tp") if leaf == "kernel" else ("tp",)
  if owner in ("o_proj", "down_proj"):  # FSDP on the first dim beside tp: the last dim (D) stays whole
    return (("tp", "fsdp"), None) if leaf == "kernel" else (None,)
  if owner == "score":
    return ("fsdp", None) if leaf == "kernel" else (None,)
  raise KeyError("/".join(names))


def _old_spec(names, shape, mesh) -> P:
  rule = _path_rule(names)
  if rule[0] == ("tp", "fsdp"):  # row-parallel kernels: tp x fsdp on the first dim when it divides,
    tp, fsdp = mesh.shape["tp"], mesh.shape["fsdp"]  # else what of it does, and fsdp on the last dim
    if shape[0] % (tp * fsdp) == 0:
      return P(("tp", "fsdp"), None)
    return P("tp" if shape[0] % tp == 0 else None, "fsdp" if shape[1] % fsdp == 0 else None)
  return P(*(ax if ax is None or dim % mesh.shape[ax] == 0 else None for ax, dim in zip(rule, shape)))


MODELS = [  # (family, tied, overrides): every kind of param the models have (biases everywhere)
  ("qwen2", True, {}),
  ("qwen3", False, {"attention_bias": True}),
  ("llama", True, {"mlp_bias": True, "attention_bias": True}),
  ("qwen2", False, {"vocab_size": 250, "intermediate_size": 250}),  # dims the mesh does not divide
]


@pytest.mark.parametrize("family,tied,overrides", MODELS)
def test_default_rules_give_the_path_rules_exactly(family, tied, overrides):
  overrides = dict(overrides)
  vocab = overrides.pop("vocab_size", 256)
  cfg = tiny_config(family, vocab_size=vocab, tie_word_embeddings=tied, **overrides)
  for cls in (CausalLM, Critic):
    model = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
    params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for mesh in (None, FakeMesh):
      specs = dict(nnx.to_flat_state(partition_specs(model, mesh)))
      assert specs.keys() == params.keys()
      for path, var in params.items():
        names = [str(p) for p in path]
        want = P(*_path_rule(names)) if mesh is None else _old_spec(names, var.shape, mesh)
        assert specs[path] == want, (cls.__name__, names, specs[path], want)


def test_rules_from_config_and_dims_the_mesh_does_not_divide():
  assert spec_for_axes(("vocab", "embed"), (250, 128), None, FakeMesh) == P(None, "fsdp")
  assert spec_for_axes(("vocab", "embed"), (256, 128), None, FakeMesh) == P("tp", "fsdp")
  assert spec_for_axes(("embed", "vocab"), (128, 250), None, FakeMesh) == P("fsdp", None)
  from agentfly_jax.rl.config import default_config

  rules = default_config().mesh.rules
  rules.mlp = "fsdp"  # as --config.mesh.rules.mlp=fsdp
  # a mesh axis is used once per param: embed (fsdp) first, so mlp stays whole
  assert spec_for_axes(("embed", "mlp"), (128, 256), rules, FakeMesh) == P("fsdp", None)
  assert spec_for_axes(("mlp", "q_heads"), (256, 128), rules, FakeMesh) == P("fsdp", "tp")
  both = {**DEFAULT_RULES, "vocab": ("fsdp", "tp")}
  assert spec_for_axes(("vocab", "embed"), (256, 128), both, FakeMesh) == P(("fsdp", "tp"), None)
  # 8 does not divide 260, fsdp (2) does: the dim keeps that prefix of its rule, and embed (fsdp) stays whole
  assert spec_for_axes(("vocab", "embed"), (260, 128), both, FakeMesh) == P("fsdp", None)
  assert spec_for_axes(("vocab", "embed"), (255, 128), both, FakeMesh) == P(None, "fsdp")
  tp_first = {**DEFAULT_RULES, "vocab": ("tp", "fsdp")}
  assert spec_for_axes(("vocab", "embed"), (260, 128), tp_first, FakeMesh) == P("tp", "fsdp")


class Router(nnx.Module):
  """A module models/sharding.py has never heard of: it only names its dims."""

  def __init__(self, d: int, experts: int):
    self.gate = param_with_axes(jnp.ones((d, experts)), ("embed", "slots"))
    self.temperature = param_with_axes(jnp.ones((experts,)), ("slots",))
    self.free = param_with_axes(jnp.ones((4, d)), (None, "embed"))


def test_a_new_module_is_sharded_by_its_names_and_a_rule():
  router = Router(128, 8)
  specs = dict(nnx.to_flat_state(partition_specs(router, FakeMesh, {**DEFAULT_RULES, "slots": "tp"})))
  assert specs == {("gate",): P("fsdp", "tp"), ("temperature",): P("tp"), ("free",): P(None, "fsdp")}
  shard_model(router, make_mesh(1, 1), {**DEFAULT_RULES, "slots": "tp"})  # places on a real mesh
  assert router.gate[...].sharding.spec == P("fsdp", "tp")


def test_unknown_or_missing_logical_names_are_clear_errors():
  with pytest.raises(ValueError, match=r"parameter gate: logical axis 'slots' has no sharding rule"):
    partition_specs(Router(128, 8), FakeMesh)

  class Unnamed(nnx.Module):
    def __init__(self):
      self.w = nnx.Param(jnp.ones((3, 3)))

  with pytest.raises(ValueError, match=r"parameter w has no logical axis names"):
    partition_specs(Unnamed())
  with pytest.raises(ValueError, match=r"rule 'mlp' -> \('data',\) names mesh axes \['data'\]"):
    spec_for_axes(("mlp",), (8,), {"mlp": "data"}, FakeMesh)
  with pytest.raises(ValueError, match="do not fit shape"):
    spec_for_axes(("embed",), (8, 8), None, FakeMesh)
  with pytest.raises(ValueError, match="logical axes .* do not fit"):
    param_with_axes(jnp.ones((2, 2)), ("embed",))
  from agentfly_jax.rl.config import default_config, validate_config

  c = default_config()
  c.mesh.rules.mlp = "fsdp"
  validate_config(c)
  c.mesh.rules = {**DEFAULT_RULES, "mlp": 3}
  with pytest.raises(ValueError, match=r"config.mesh.rules=.*'mlp' -> 3"):
    validate_config(c)


def test_decode_layout_copy_keeps_its_names():
  model = CausalLM(tiny_config("qwen3", vocab_size=256, tie_word_embeddings=False), rngs=nnx.Rngs(0))
  before = partition_specs(model, FakeMesh)
  names_before = {path: logical_axes(var) for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  set_kernel_layout(model, "out_in")
  after = dict(nnx.to_flat_state(partition_specs(model, FakeMesh)))
  params_after = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  for path, spec in nnx.to_flat_state(before):
    if path[-1] != "kernel":
      assert after[path] == spec, path
      continue
    names = logical_axes(params_after[path])
    assert names == names_before[path][::-1], path
    assert after[path] == spec_for_axes(names, params_after[path].shape, None, FakeMesh), path
    if path[-2] not in ("o_proj", "down_proj"):  # no mesh axis shared between the dims' rules
      assert after[path] == P(*tuple(spec)[::-1]), path


@pytest.mark.slow
@pytest.mark.eight_devices("sharding")
def test_forward_on_8_fake_devices_matches_single_device(eight_device_check):
  """tests/sharding_check.py, in the test run's 8-device child process."""
  assert eight_device_check["ok"] and "SHARDING OK" in eight_device_check["output"], eight_device_check["output"]


def test_make_mesh_checks_device_count():
  with pytest.raises(ValueError, match="needs 16 devices"):
    make_mesh(fsdp=4, tp=4)
  mesh = make_mesh(fsdp=-1, tp=1)
  assert mesh.axis_names == ("fsdp", "tp")


def test_a_config_saved_before_the_rules_existed_still_validates():
  import json

  import ml_collections

  from agentfly_jax.rl.config import default_config, validate_config

  saved = json.loads(default_config().to_json())
  del saved["mesh"]["rules"], saved["train"]["remat"]  # an older run's config.json
  old = ml_collections.ConfigDict(saved)
  assert validate_config(old).remat is False  # defaults apply
  assert old.mesh.get("rules") is None
