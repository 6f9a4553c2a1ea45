"""Run as a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8: the sharded
train_step on 2x4 and 4x2 (fsdp, tp) meshes gives the same params as on a 1-device mesh, and
params keep the shardings of their partition rules. Prints OK on success."""

import os
import sys

import jax
import numpy as np
import optax
from flax import nnx

from agentfly_jax.models import CausalLM, make_mesh, partition_specs, shard_model, tiny_config
from agentfly_jax.rl.batching import to_microbatches
from agentfly_jax.rl.core.train_state import create_train_state
from agentfly_jax.rl.core.train_step import batch_sharding, jit_step, make_train_step, state_shardings
from agentfly_jax.rl.programs import default_loss_config

B, T, V = 8, 16, 128


def run(fsdp, tp, batch):
  mesh = make_mesh(fsdp, tp)
  model = CausalLM(tiny_config("llama", vocab_size=V, tie_word_embeddings=False), rngs=nnx.Rngs(0))
  shard_model(model, mesh)
  specs = partition_specs(model, mesh)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt = optax.sgd(0.5)  # (adam would turn reduction-order noise in near-zero grads into +-lr steps)
  state = create_train_state(params, opt)
  sh = state_shardings(state, mesh, specs, optimizer=opt)
  state = jax.device_put(state, sh)
  mb = to_microbatches(batch, np.arange(B), 4)
  step = jit_step(
    make_train_step(graphdef, rest, opt, default_loss_config(agg="token-mean", kl_coef=0.0)),
    sh,
    batch_sharding(mesh, mb),
  )
  mb = {k: jax.device_put(v, s) for (k, v), s in zip(mb.items(), batch_sharding(mesh, mb).values())}
  for _ in range(2):
    state, metrics = step(state, mb)
  flat_specs = dict(nnx.to_flat_state(specs))
  for path, var in nnx.to_flat_state(state.params):
    arr = var[...] if hasattr(var, "shape") and not isinstance(var, jax.Array) else var
    got = arr.sharding.spec
    want = flat_specs[path]
    want = want[...] if not isinstance(want, jax.sharding.PartitionSpec) else want
    if tuple(got) + (None,) * (len(want) - len(got)) != tuple(want) + (None,) * (len(got) - len(want)):
      sys.exit(f"param {path}: sharding {got} != rule {want}")
  return jax.tree.map(np.asarray, jax.tree.leaves(state.params)), float(metrics["actor/pg_loss"])


def main():
  assert len(jax.devices()) == 8, jax.devices()
  rng = np.random.default_rng(0)
  ids = rng.integers(0, V, size=(B, T + 1)).astype(np.int32)
  action = rng.random((B, T)) < 0.5
  batch = {
    "input_ids": ids[:, :-1],
    "target_ids": ids[:, 1:],
    "attention_mask": np.ones((B, T), bool),
    "action_mask": action,
    "old_logprobs": np.where(action, -rng.random((B, T)) * 4, 0).astype(np.float32),
    "advantages": np.where(action, rng.normal(size=(B, T)), 0).astype(np.float32),
  }
  ref, ref_loss = run(1, 1, batch)
  for fsdp, tp in [(2, 4), (4, 2)]:
    got, loss = run(fsdp, tp, batch)
    for a, b in zip(ref, got):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert abs(loss - ref_loss) < 1e-4, (loss, ref_loss)
  print("OK")


if __name__ == "__main__":
  main()
