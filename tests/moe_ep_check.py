"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/models/test_moe_ep.py):
a tiny Qwen3-MoE with its experts split over an 'expert' mesh axis (tokens exchanged with all_to_all
under shard_map, models/moe.py) gives the single-device model's logits, routes and gradients, on
(fsdp 2, expert 4) and (fsdp 1, expert 4, tp 2) meshes, LoRA adapters on the experts included; an
expert-parallel degree that does not divide the experts is refused naming config.mesh.expert.
Prints 'MOE EP OK' at the end."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from agentfly_jax.models import CausalLM, make_mesh, partition_specs, tiny_config
from agentfly_jax.models.lora import LoRAConfig, apply_lora
from agentfly_jax.models.moe import ExpertLinear
from agentfly_jax.models.sharding import DEFAULT_RULES, activation_sharding


def build(lora: bool):
  cfg = tiny_config("qwen3_moe", vocab_size=128, hidden_size=64, head_dim=16, intermediate_size=96)
  model = CausalLM(cfg, rngs=nnx.Rngs(0))
  if lora:
    apply_lora(model, LoRAConfig(rank=4, alpha=8.0, targets="q,v,expert_gate,expert_up,expert_down"), rngs=nnx.Rngs(1))
    for i, (_, mod) in enumerate(nnx.iter_modules(model)):
      if isinstance(mod, ExpertLinear) and mod.lora_b is not None:
        mod.lora_b[...] = 0.05 * jax.random.normal(jax.random.key(i), mod.lora_b.shape)
  return model


def program(graphdef, mesh):
  def loss(params, rest, ids, mask, probe):
    model = nnx.merge(graphdef, params, rest)
    with activation_sharding(mesh, DEFAULT_RULES):
      hidden, _, routes = model.hidden_states(ids, attention_mask=mask, with_router=True)
      logits = model.logits_from_hidden(hidden)
    return jnp.sum(logits * probe), (logits, routes.experts)

  return jax.jit(jax.value_and_grad(loss, has_aux=True))


def run(model, mesh, ids, mask, probe, wrt):
  graphdef, params, rest = nnx.split(model, wrt, ...)
  if mesh is not None:
    specs = partition_specs(params, mesh)
    params = jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
    rows = NamedSharding(mesh, P(("fsdp", "expert")) if ids.shape[0] % (mesh.size // mesh.shape["tp"]) == 0 else P())
    ids, mask, probe = (jax.device_put(x, rows) for x in (ids, mask, probe))
  fn = program(graphdef, mesh)
  if mesh is not None:  # the tokens really travel: all_to_all in the compiled program
    assert "all-to-all" in fn.lower(params, rest, ids, mask, probe).compile().as_text()
  (value, (logits, experts)), grads = fn(params, rest, ids, mask, probe)
  return float(value), np.asarray(logits), np.asarray(experts), jax.tree.map(np.asarray, grads)


def check(lora: bool, mesh):
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, 128, (8, 12)), jnp.int32)
  mask = jnp.asarray(np.arange(12)[None, :] >= rng.integers(0, 5, (8, 1)))
  probe = jnp.asarray(rng.normal(size=(8, 12, 128)), jnp.float32)
  wrt = nnx.LoRAParam if lora else nnx.Param
  ref = run(build(lora), None, ids, mask, probe, wrt)
  got = run(build(lora), mesh, ids, mask, probe, wrt)
  np.testing.assert_allclose(got[1], ref[1], rtol=2e-5, atol=2e-5)
  assert (got[2] == ref[2]).all(), "routes differ"
  np.testing.assert_allclose(got[0], ref[0], rtol=1e-4)
  for (path, g), (_, r) in zip(nnx.to_flat_state(got[3]), nnx.to_flat_state(ref[3])):
    # float32 sums over tokens in another order (all_to_all, sharded rows): an element's error scales with
    # its tensor's largest entries (the embedding's gradient reaches ~40, so a 0.01 entry may move 2e-5)
    r = np.asarray(r)
    atol = 1e-5 + 2e-6 * float(np.abs(r).max())
    np.testing.assert_allclose(np.asarray(g), r, rtol=1e-4, atol=atol, err_msg=str(path))
  n = sum(1 for _ in nnx.to_flat_state(got[3]))
  print(f"mesh {dict(mesh.shape)} lora={lora}: logits, routes and {n} gradients equal")


def main():
  assert len(jax.devices()) == 8
  m = make_mesh(2, 1, expert=4)
  assert m.axis_names == ("fsdp", "expert", "tp")
  model = build(False)
  spec = partition_specs(model, m)["model"]["layers"][0]["mlp"]["experts"]["gate_proj"]["kernel"]
  assert spec[0] == "expert", spec
  check(False, m)
  check(False, make_mesh(1, 2, expert=4))
  check(True, make_mesh(1, 2, expert=4))
  try:
    check(False, make_mesh(2, 1, expert=3))
  except ValueError as e:
    assert "config.mesh.expert" in str(e) and "num_experts=8" in str(e), e
    print("refused:", e)
  else:
    raise AssertionError("expert=3 with 8 experts was not refused")
  print("MOE EP OK")


if __name__ == "__main__":
  main()
