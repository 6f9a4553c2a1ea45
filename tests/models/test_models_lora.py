"""LoRA adapters inside layers.Linear (models/lora.py): exactness at zero B, gradients against
autodiff of the merged weights, a train step that moves only adapters, validation errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agentfly_jax.models import CausalLM, set_kernel_layout, tiny_config
from agentfly_jax.models.layers import Linear
from agentfly_jax.models.lora import LoRAConfig, apply_lora, base_params, merge_lora, params_sha256, target_paths
from agentfly_jax.models.sharding import make_mesh, partition_specs

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

# 2 x 160 = 320 rows >= cpu_kernels.FUSE_MIN_ROWS: the fused q/k/v and gate/up path runs
B, T = 2, 160


def _ids(seed, vocab=256):
  return jax.random.randint(jax.random.key(seed), (B, T), 0, vocab, jnp.int32)


def _model(targets=("q", "k", "v", "o", "gate", "up", "down"), rank=4, *, fuse=True, family="qwen2"):
  m = CausalLM(tiny_config(family, fuse_projections=fuse), rngs=nnx.Rngs(0))
  return apply_lora(m, LoRAConfig(rank=rank, alpha=8.0, targets=targets), rngs=nnx.Rngs(1))


def _randomize_b(model, seed=2):
  """Fresh random (non-zero) B's, so the adapters change the output."""
  for i, (_, m) in enumerate(
    sorted(
      ((p, m) for p, m in nnx.iter_modules(model) if isinstance(m, Linear) and m.lora_b is not None),
      key=lambda pm: str(pm[0]),
    )
  ):
    m.lora_b[...] = 0.05 * jax.random.normal(jax.random.key(seed + i), m.lora_b.shape)


@pytest.mark.parametrize("fuse", [True, False])
def test_zero_b_equals_base_exactly(fuse):
  base = CausalLM(tiny_config("qwen2", fuse_projections=fuse), rngs=nnx.Rngs(0))
  ref = base(_ids(0))
  lora = apply_lora(base, LoRAConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(1))
  assert len(target_paths(lora)) == 2 * 7
  np.testing.assert_array_equal(np.asarray(lora(_ids(0))), np.asarray(ref))


def test_adapters_are_lora_params_with_axes_and_float32():
  m = _model(rank=3)
  q = m.model.layers[0].self_attn.q_proj
  assert isinstance(q.lora_a, nnx.LoRAParam) and isinstance(q.lora_a, nnx.Param)
  assert q.lora_a.shape == (128, 3) and q.lora_b.shape == (3, 128)
  assert q.lora_a.dtype == jnp.float32 and float(jnp.abs(q.lora_a[...]).max()) > 0
  assert not np.any(np.asarray(q.lora_b[...]))
  specs = partition_specs(m, make_mesh(1, 1))  # every param (adapters too) has a rule
  assert len(jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))) == len(
    jax.tree.leaves(nnx.state(m, nnx.Param))
  )
  assert q.lora_a.get_metadata()["out_sharding"] == ("embed", "lora_rank")
  assert q.lora_b.get_metadata()["out_sharding"] == ("lora_rank", "q_heads")


@pytest.mark.parametrize("fuse", [True, False])
def test_merged_model_equals_adapted_and_decode_layout(fuse):
  m = _model(fuse=fuse, family="llama")
  _randomize_b(m)
  out = m(_ids(3))
  base_out = CausalLM(tiny_config("llama", fuse_projections=fuse), rngs=nnx.Rngs(0))(_ids(3))
  assert float(jnp.abs(out - base_out).max()) > 1e-3  # the adapters matter
  merged = merge_lora(m)
  assert not target_paths(merged) and target_paths(m)  # the original keeps its adapters
  np.testing.assert_allclose(np.asarray(merged(_ids(3))), np.asarray(out), atol=2e-5, rtol=1e-5)
  # the sampler's [out, in] decode copy: adapters do not depend on the kernel layout
  g, s = nnx.split(m)
  decode = set_kernel_layout(nnx.merge(g, s), "out_in")
  np.testing.assert_allclose(np.asarray(decode(_ids(3))), np.asarray(out), atol=2e-5, rtol=1e-5)


@pytest.mark.slow
def test_gradients_equal_autodiff_of_merged_weights():
  m = _model(targets=("q", "v", "o", "up", "down"), fuse=True)
  _randomize_b(m)
  ids = _ids(4)
  w = jax.random.normal(jax.random.key(5), (B, T, 256))
  graphdef, adapters, rest = nnx.split(m, nnx.LoRAParam, ...)

  def loss(a, rest, ids, w):
    return jnp.sum(nnx.merge(graphdef, a, rest)(ids) * w)

  # one jitted program each (model and inputs as arguments), not op by op
  grads = nnx.to_flat_state(jax.jit(jax.grad(loss))(adapters, rest, ids, w))
  # reference: a model with no adapter code path, whose kernels are W + A B * scale
  plain = CausalLM(tiny_config("qwen2", fuse_projections=True), rngs=nnx.Rngs(0))
  pg, pstate = nnx.split(plain, nnx.Param)
  flat_adapters = dict(nnx.to_flat_state(adapters))
  scale = 8.0 / 4

  def ref_loss(a, pstate, ids, w):
    flat = dict(nnx.to_flat_state(pstate))
    for path in {p[:-1] for p in a}:
      kernel = flat[path + ("kernel",)]
      merged = kernel[...] + jnp.matmul(a[path + ("lora_a",)], a[path + ("lora_b",)], precision="highest") * scale
      flat[path + ("kernel",)] = kernel.replace(merged)
    return jnp.sum(nnx.merge(pg, nnx.from_flat_state(flat))(ids) * w)

  ref = jax.jit(jax.grad(ref_loss))({p: v[...] for p, v in flat_adapters.items()}, pstate, ids, w)
  assert len(grads) == 2 * 5 * 2
  for path, g in grads:
    r = np.asarray(ref[path])
    assert np.abs(r).max() > 0, path
    np.testing.assert_allclose(np.asarray(g[...]), r, rtol=2e-4, atol=2e-4 * np.abs(r).max(), err_msg=str(path))


def test_train_step_moves_only_adapters_and_optimizer_holds_adapters_only():
  from agentfly_jax.rl.core.train_state import create_train_state, make_optimizer
  from agentfly_jax.rl.core.train_step import make_train_step
  from agentfly_jax.rl.programs import default_loss_config

  m = _model(rank=4)
  graphdef, adapters, rest = nnx.split(m, nnx.LoRAParam, ...)
  base_before = jax.tree.map(np.array, base_params(m))
  opt = make_optimizer(lr=1e-2)
  state = create_train_state(adapters, opt)
  # AdamW moments: one per adapter, nothing of the base
  opt_leaves = jax.tree.leaves(state.opt_state)
  n_adapters = len(jax.tree.leaves(adapters))
  assert sum(x.size for x in opt_leaves) <= 2 * sum(x.size for x in jax.tree.leaves(adapters)) + 8
  assert len([x for x in opt_leaves if x.ndim == 2]) == 2 * n_adapters
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 256, (1, 4, 24)).astype(np.int32)
  mask = np.ones((1, 4, 24), bool)
  mask[..., :8] = False
  batch = dict(
    input_ids=ids,
    target_ids=np.roll(ids, -1, -1),
    attention_mask=np.ones_like(mask),
    action_mask=mask,
    old_logprobs=np.full((1, 4, 24), -5.0, np.float32),
    advantages=rng.normal(size=(1, 4, 24)).astype(np.float32),
  )
  step = jax.jit(make_train_step(graphdef, rest, opt, default_loss_config(agg="token-mean", logits_capacity=())))
  new_state, metrics = step(state, batch)
  assert float(metrics["actor/grad_norm"]) > 0
  for (path, old), (_, new) in zip(nnx.to_flat_state(adapters), nnx.to_flat_state(new_state.params)):
    if path[-1] == "lora_b":
      assert np.abs(np.asarray(new[...]) - np.asarray(old[...])).max() > 0, path
  after = nnx.merge(graphdef, new_state.params, rest)
  for (path, a), (_, b) in zip(nnx.to_flat_state(base_before), nnx.to_flat_state(base_params(after))):
    np.testing.assert_array_equal(np.asarray(b[...]), np.asarray(a[...]), err_msg=str(path))
  assert params_sha256(base_params(after)) == params_sha256(base_before)


def test_path_pattern_targets_and_validation_errors():
  m = CausalLM(tiny_config("qwen2"), rngs=nnx.Rngs(0))
  apply_lora(m, LoRAConfig(rank=2, targets=r"layers\.1\..*(q|v)_proj"), rngs=nnx.Rngs(0))
  assert target_paths(m) == ["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"]
  with pytest.raises(ValueError, match="model.lora.rank must be an int >= 1"):
    LoRAConfig(rank=0)
  with pytest.raises(ValueError, match="model.lora.alpha"):
    LoRAConfig(rank=2, alpha=-1.0)
  with pytest.raises(ValueError, match=r"model.lora.targets: '\(' is neither"):
    LoRAConfig(targets="q,(")
  with pytest.raises(ValueError, match="critic.lora.targets: 'qproj' matches no projection"):
    apply_lora(
      CausalLM(tiny_config("qwen2"), rngs=nnx.Rngs(0)),
      LoRAConfig(targets="q,qproj", field="critic.lora"),
      rngs=nnx.Rngs(0),
    )
  with pytest.raises(ValueError, match=r"model.lora.targets: 'layers\\\\.7\\\\.' matches no projection"):
    apply_lora(CausalLM(tiny_config("qwen2"), rngs=nnx.Rngs(0)), LoRAConfig(targets=r"layers\.7\."), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="already has LoRA adapters"):
    apply_lora(m, LoRAConfig(rank=2, targets="q"), rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_adapters_on_scanned_layers_equal_unrolled_in_logits_and_adapter_gradients():
  """The agreed layout: adapters live in `Linear`, so under `scan_layers` they stack to [L, ...]
  like the kernels; a scanned model holding the unrolled model's stacked weights and adapters
  (random B) gives the same logits and the same adapter gradients, stacked."""
  from agentfly_jax.models.layer_stack import stack_layers

  cfg = tiny_config(
    "qwen2",
    num_hidden_layers=3,
    vocab_size=120,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
  )
  lcfg = LoRAConfig(rank=4, alpha=8.0)
  unrolled = apply_lora(CausalLM(cfg, rngs=nnx.Rngs(0)), lcfg, rngs=nnx.Rngs(1))
  for i, (_, var) in enumerate(nnx.to_flat_state(nnx.state(unrolled, nnx.LoRAParam))):
    if var.shape[-2] == 4:  # lora_b [rank, out]: random, so the adapters change the output
      var.set_value(0.1 * jax.random.normal(jax.random.key(i), var.shape))
  abstract = nnx.eval_shape(
    lambda: apply_lora(CausalLM(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0)), lcfg, rngs=nnx.Rngs(1))
  )
  graphdef, _ = nnx.split(abstract)
  scanned = nnx.merge(graphdef, stack_layers(nnx.state(unrolled)))
  adapters = dict(nnx.to_flat_state(nnx.state(scanned, nnx.LoRAParam)))
  assert adapters and all(v.shape[0] == 3 for v in adapters.values())  # [L, ...]
  ids = jax.random.randint(jax.random.key(5), (2, 9), 0, 120, jnp.int32)

  def loss_and_grads(model):
    """(logits, adapter gradients) of one jitted program per layout."""
    g, lora, rest = nnx.split(model, nnx.LoRAParam, ...)

    def loss(lo, r):
      logits = nnx.merge(g, lo, r)(ids)
      return jnp.sum(jnp.sin(logits)), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(lora, rest)
    return logits, grads

  logits_u, grads_u = loss_and_grads(unrolled)
  logits_s, grads_s = loss_and_grads(scanned)
  np.testing.assert_allclose(np.asarray(logits_s), np.asarray(logits_u), rtol=2e-5, atol=2e-5)
  stacked_u = dict(nnx.to_flat_state(stack_layers(grads_u)))
  flat_s = dict(nnx.to_flat_state(grads_s))
  assert set(stacked_u) == set(flat_s)
  for path, g in flat_s.items():
    np.testing.assert_allclose(np.asarray(g[...]), np.asarray(stacked_u[path][...]), rtol=1e-4, atol=1e-5)
