"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (see
tests/test_models_sharding.py): the forward pass on 2x4 and 4x2 ('fsdp', 'tp') meshes equals the
single-device result, and each param's sharding equals its rule. Prints 'SHARDING OK' at the end."""

from __future__ import annotations

import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from agentfly_jax.models import CausalLM, Critic, from_pretrained, make_mesh, save_pretrained, shard_model, tiny_config

# The rules, written out independently of agentfly_jax.models.sharding.
EXPECTED = {
  "embedding": P("tp", "fsdp"),
  "q_proj/kernel": P("fsdp", "tp"),
  "k_proj/kernel": P("fsdp", "tp"),
  "v_proj/kernel": P("fsdp", "tp"),
  "q_proj/bias": P("tp"),
  "k_proj/bias": P("tp"),
  "v_proj/bias": P("tp"),
  "o_proj/kernel": P(("tp", "fsdp"), None),
  "gate_proj/kernel": P("fsdp", "tp"),
  "up_proj/kernel": P("fsdp", "tp"),
  "down_proj/kernel": P(("tp", "fsdp"), None),
  "lm_head/kernel": P("fsdp", "tp"),
  "score/kernel": P("fsdp", None),
  "score/bias": P(None),
  "scale": P(None),
}


def expected_spec(path) -> P:
  names = [str(p) for p in path]
  for key in ("/".join(names[-2:]), names[-1]):
    if key in EXPECTED:
      return EXPECTED[key]
  raise KeyError("/".join(names))


def check_param_shardings(model, mesh, label):
  n_split = 0
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    arr = var[...]
    want = expected_spec(path)
    assert isinstance(arr.sharding, NamedSharding), (label, path, arr.sharding)
    got = tuple(arr.sharding.spec) + (None,) * (arr.ndim - len(arr.sharding.spec))
    want_t = tuple(want) + (None,) * (arr.ndim - len(want))
    assert got == want_t, (label, path, got, want_t)
    assert arr.sharding.mesh.shape == mesh.shape, (label, path)
    shard_shape = arr.addressable_shards[0].data.shape
    split = lambda a: (
      1 if a is None else mesh.shape[a] if isinstance(a, str) else int(np.prod([mesh.shape[x] for x in a]))
    )  # noqa: E731
    expect_shape = tuple(d // split(a) for d, a in zip(arr.shape, want_t))
    assert shard_shape == expect_shape, (label, path, shard_shape, expect_shape)
    n_split += shard_shape != arr.shape
  assert n_split > 10, (label, n_split)


@nnx.jit
def forward(model, ids, mask):
  return model(ids, attention_mask=mask)


def main():
  assert jax.device_count() == 8, jax.device_count()
  ids = jnp.asarray(np.random.default_rng(0).integers(0, 256, (8, 12)), jnp.int32)
  mask = jnp.asarray(np.arange(12)[None, :] >= np.array([0, 3, 0, 5, 1, 0, 7, 2])[:, None])
  for model_type, tie in (("qwen2", True), ("qwen3", False)):
    cfg = tiny_config(model_type, vocab_size=256, tie_word_embeddings=tie)
    ref_model = CausalLM(cfg, rngs=nnx.Rngs(1))
    with jax.default_device(jax.devices()[0]):
      ref = np.asarray(forward(ref_model, ids, mask))
    folder = tempfile.mkdtemp()
    save_pretrained(ref_model, folder)
    for fsdp, tp in ((2, 4), (4, 2)):
      mesh = make_mesh(fsdp=fsdp, tp=tp)
      model = shard_model(CausalLM(cfg, rngs=nnx.Rngs(1)), mesh)
      check_param_shardings(model, mesh, f"{model_type} {fsdp}x{tp}")
      batch = NamedSharding(mesh, P("fsdp", None))
      out = np.asarray(forward(model, jax.device_put(ids, batch), jax.device_put(mask, batch)))
      err = np.max(np.abs(out - ref)) / np.max(np.abs(ref))
      assert err <= 1e-5, (model_type, fsdp, tp, err)
      loaded = from_pretrained(folder, mesh=mesh)
      check_param_shardings(loaded, mesh, f"{model_type} loaded {fsdp}x{tp}")
      out2 = np.asarray(forward(loaded, ids, mask))
      assert np.max(np.abs(out2 - ref)) / np.max(np.abs(ref)) <= 1e-5
      print(f"{model_type} tie={tie} mesh {fsdp}x{tp}: rel err {err:.2e}", flush=True)
  # Critic on a 2x4 mesh.
  mesh = make_mesh(2, 4)
  critic = Critic(tiny_config("qwen2", vocab_size=256), rngs=nnx.Rngs(2))
  ref = np.asarray(nnx.jit(lambda c, x: c(x))(critic, ids))
  shard_model(critic, mesh)
  check_param_shardings(critic, mesh, "critic")
  out = np.asarray(nnx.jit(lambda c, x: c(x))(critic, ids))
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
  # A module models/sharding.py does not know: its names + one rule shard it.
  from agentfly_jax.models import DEFAULT_RULES, param_with_axes

  class Router(nnx.Module):
    def __init__(self):
      self.gate = param_with_axes(jnp.ones((128, 8)), ("embed", "experts"))

  router = shard_model(Router(), mesh, {**DEFAULT_RULES, "experts": "tp"})
  assert router.gate[...].sharding.spec == P("fsdp", "tp"), router.gate[...].sharding
  assert router.gate[...].addressable_shards[0].data.shape == (64, 2)
  print("SHARDING OK")
  return 0


if __name__ == "__main__":
  sys.exit(main())
