"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (see
tests/test_models_lora_mesh.py): a LoRA GRPO train step on a 2x2 ('fsdp', 'tp') mesh (adapters
sharded by their logical axes, the frozen base passed as an argument) equals the single-device
step. Prints 'LORA MESH OK' at the end."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from agentfly_jax.models import CausalLM, make_mesh, partition_specs, shard_model, tiny_config
from agentfly_jax.models.layers import Linear
from agentfly_jax.models.lora import LoRAConfig, apply_lora
from agentfly_jax.rl.core.train_state import create_train_state, make_optimizer
from agentfly_jax.rl.core.train_step import batch_sharding, jit_step, make_train_step, state_shardings
from agentfly_jax.rl.programs import default_loss_config


def build():
  m = CausalLM(tiny_config("qwen2"), rngs=nnx.Rngs(0))
  apply_lora(m, LoRAConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(1))
  for i, (_, mod) in enumerate(
    sorted(
      ((str(p), x) for p, x in nnx.iter_modules(m) if isinstance(x, Linear) and x.lora_b is not None),
      key=lambda px: px[0],
    )
  ):
    mod.lora_b[...] = 0.05 * jax.random.normal(jax.random.key(i), mod.lora_b.shape)
  return m


def batch():
  rng = np.random.default_rng(0)
  shape = (2, 4, 32)
  ids = rng.integers(0, 256, shape).astype(np.int32)
  mask = np.ones(shape, bool)
  mask[..., :10] = False
  return dict(
    input_ids=ids,
    target_ids=np.roll(ids, -1, -1),
    attention_mask=np.ones(shape, bool),
    action_mask=mask,
    old_logprobs=np.full(shape, -5.0, np.float32),
    advantages=rng.normal(size=shape).astype(np.float32),
  )


def run(mesh):
  model = build()
  opt = make_optimizer(lr=1e-2)
  cfg = default_loss_config(agg="token-mean", kl_coef=0.0)
  if mesh is None:
    g, params, rest = nnx.split(model, nnx.LoRAParam, ...)
    step = jax.jit(make_train_step(g, rest, opt, cfg))
    state, metrics = step(create_train_state(params, opt), batch(), (rest, None))
    return state, metrics
  shard_model(model, mesh)
  g, params, rest = nnx.split(model, nnx.LoRAParam, ...)
  specs = partition_specs(params, mesh)
  state = create_train_state(params, opt)
  sh = state_shardings(state, mesh, specs, optimizer=opt)
  state = jax.device_put(state, sh)
  b = batch()
  bsh = batch_sharding(mesh, b)
  step = jit_step(make_train_step(g, rest, opt, cfg), sh, bsh, (rest, None))
  out, metrics = step(state, jax.device_put(b, bsh), (rest, None))
  a = out.params["model"]["layers"][0]["mlp"]["up_proj"]["lora_a"]
  assert a.sharding.spec == P("fsdp", None), a.sharding.spec  # ('embed', 'lora_rank')
  b_ = out.params["model"]["layers"][0]["mlp"]["up_proj"]["lora_b"]
  assert b_.sharding.spec == P(None, "tp"), b_.sharding.spec  # ('lora_rank', 'mlp')
  return out, metrics


def main():
  assert len(jax.devices()) == 8
  ref_state, ref_m = run(None)
  state, m = run(make_mesh(2, 2))
  for (path, a), (_, b) in zip(nnx.to_flat_state(ref_state.params), nnx.to_flat_state(state.params)):
    np.testing.assert_allclose(
      np.asarray(b[...]), np.asarray(a[...]), rtol=1e-4, atol=1e-4, err_msg=str(path)
    )  # Adam: lr 1e-2 per step
  for k in ("actor/pg_loss", "actor/grad_norm"):
    np.testing.assert_allclose(float(m[k]), float(ref_m[k]), rtol=1e-4)
  print("LORA MESH OK")


if __name__ == "__main__":
  main()
