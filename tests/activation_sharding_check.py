"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (see
tests/test_models_activation_sharding.py): on 2x4 and 4x2 ('fsdp', 'tp') meshes, the GRPO train step
(unrolled and scanned layers), prepare and greedy sampling with activation shardings
(`activation_sharding`) equal the same programs without them, and the constrained programs do carry
the constraints. Prints 'ACTIVATION SHARDING OK' at the end."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from agentfly_jax.models import CausalLM, make_mesh, partition_specs, shard_model, tiny_config
from agentfly_jax.rl.core.prepare import make_prepare
from agentfly_jax.rl.update import default_prepare_config
from agentfly_jax.rl.core.train_state import create_train_state
from agentfly_jax.rl.core.train_step import batch_sharding, jit_step, make_train_step, state_shardings
from agentfly_jax.rl.programs import default_loss_config
from agentfly_jax.sampling import JaxSampler, SamplingParams


def batch_arrays(vocab: int, m: int, mb: int, length: int, seed: int) -> dict:
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, vocab, (m, mb, length)).astype(np.int32)
  attention = np.arange(length)[None, None, :] < rng.integers(length // 2, length + 1, (m, mb, 1))
  action = attention & (np.arange(length)[None, None, :] >= length // 4)
  return dict(
    input_ids=ids,
    target_ids=np.roll(ids, -1, axis=-1),
    attention_mask=attention,
    action_mask=action,
    old_logprobs=(-rng.random((m, mb, length)) * 3).astype(np.float32),
    advantages=rng.standard_normal((m, mb, length)).astype(np.float32),
  )


def n_constraints(lowered) -> int:
  text = lowered.as_text()
  return text.count("sharding_constraint") + text.count("@Sharding")


def check_train_step(cfg, mesh, label):
  model = shard_model(CausalLM(cfg, rngs=nnx.Rngs(3)), mesh)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt = optax.sgd(0.5)  # (Adam's first steps are ~lr * sign(g): float noise in tiny grads would flip)
  state_sh = state_shardings(
    jax.eval_shape(lambda p: create_train_state(p, opt), params), mesh, partition_specs(params, mesh), optimizer=opt
  )
  host = batch_arrays(cfg.vocab_size, 2, 8, 16, seed=1)
  batch_sh = batch_sharding(mesh, host)
  batch = {k: jax.device_put(v, batch_sh[k]) for k, v in host.items()}
  outs, counts = [], []
  for constrained in (False, True):
    kw = dict(mesh=mesh, rules=None) if constrained else {}
    step = jit_step(
      make_train_step(graphdef, rest, opt, default_loss_config(agg="token-mean"), **kw), state_sh, batch_sh
    )
    state = jax.jit(lambda p: create_train_state(p, opt), out_shardings=state_sh)(params)
    counts.append(n_constraints(step.lower(state, batch)))
    for _ in range(2):
      state, metrics = step(state, batch)
    outs.append((jax.device_get(state.params), jax.device_get(metrics)))
  assert counts[0] == 0 and counts[1] >= 4, (label, counts)
  for a, b in zip(jax.tree.leaves(outs[1]), jax.tree.leaves(outs[0])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=label)
  print(f"{label}: train step equal, {counts[1]} constraints", flush=True)
  return model


def check_prepare_and_sampler(model, mesh, label):
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  host = {k: v[0] for k, v in batch_arrays(model.config.vocab_size, 1, 8, 16, seed=2).items()}
  arrays = dict(
    input_ids=host["input_ids"],
    target_ids=host["target_ids"],
    attention_mask=host["attention_mask"],
    action_mask=host["action_mask"],
    sampler_logprobs=host["old_logprobs"],
    rewards=np.arange(8, dtype=np.float32),
    group_ids=np.repeat(np.arange(2, dtype=np.int32), 4),
  )
  rows = NamedSharding(mesh, P("fsdp"))
  arrays = {k: jax.device_put(v, rows) for k, v in arrays.items()}
  outs = []
  for kw in ({}, dict(mesh=mesh)):
    prepare = make_prepare(graphdef, rest, default_prepare_config(estimator="grpo", chunk=4), **kw)
    outs.append(jax.device_get(prepare(params, params, None, arrays)))
  for a, b in zip(jax.tree.leaves(outs[1]), jax.tree.leaves(outs[0])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=label)
  prompts = [[5, 9, 17, 3], [2, 8], [7], [1, 2, 3, 4, 5]]
  greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
  got = [
    JaxSampler(model, max_batch_size=4, max_len=16, kernel_layout="in_out", **kw).generate(prompts, greedy)
    for kw in ({}, dict(mesh=mesh))
  ]
  assert [r.token_ids for r in got[1]] == [r.token_ids for r in got[0]], label
  np.testing.assert_allclose([r.logprobs for r in got[1]], [r.logprobs for r in got[0]], atol=1e-4)
  print(f"{label}: prepare and greedy sampling equal", flush=True)


def main():
  assert jax.device_count() == 8, jax.device_count()
  for fsdp, tp, scan in ((2, 4, True), (4, 2, False)):
    mesh = make_mesh(fsdp, tp)
    cfg = tiny_config("qwen3", vocab_size=256, tie_word_embeddings=False, scan_layers=scan, remat="full")
    label = f"{fsdp}x{tp} scan_layers={scan}"
    model = check_train_step(cfg, mesh, label)
    if scan:
      check_prepare_and_sampler(model, mesh, label)
  print("ACTIVATION SHARDING OK")
  return 0


if __name__ == "__main__":
  sys.exit(main())
