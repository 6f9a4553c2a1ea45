"""The CPU kernels (models/cpu_kernels.py) against the plain path. Fused projections (ModelConfig.fuse_projections: q/k/v and gate/up each one GEMM over the
concatenated kernels) equal the separate projections: logits and every parameter gradient of a
random loss (Qwen2: q/k/v biases), and the cached decode path in both kernel layouts (the row
threshold that keeps decode unfused is lowered here so every path fuses); the
parameter tree (names, shapes) is the same, so checkpoints and HF/vLLM weight maps carry over."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from flax import nnx

from agentfly_jax.models import CausalLM, tiny_config
from agentfly_jax.models import cpu_kernels
from agentfly_jax.models.cpu_kernels import fused_linear
from agentfly_jax.models.layers import set_kernel_layout

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

B, T, V = 2, 11, 64


def _model(fuse):
  cfg = tiny_config(
    "qwen2",
    vocab_size=V,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    fuse_projections=fuse,
  )
  return CausalLM(cfg, rngs=nnx.Rngs(0))


def test_fused_projections_match_separate_values_and_grads(monkeypatch):
  monkeypatch.setattr(cpu_kernels, "FUSE_MIN_ROWS", 1)  # fuse at these small test shapes too
  rng = np.random.default_rng(3)
  ids = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
  attn = jnp.asarray(np.arange(T)[None] < np.array([T, 7])[:, None])
  weights = jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32)
  results = []
  for fuse in (False, True):
    graphdef, params = nnx.split(_model(fuse))
    # random biases (tiny_config inits them to zero), the same in both models
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(p.size), p.shape), params)

    def loss(p, graphdef=graphdef):
      logits = nnx.merge(graphdef, p)(ids, attention_mask=attn)
      return (jnp.where(attn[..., None], logits, 0.0) * weights).sum(), logits

    results.append((params, jax.jit(jax.value_and_grad(loss, has_aux=True))(params)))
  (p0, ((v0, l0), g0)), (p1, ((v1, l1), g1)) = results
  assert jax.tree.structure(p0) == jax.tree.structure(p1)  # same param names/paths
  m = np.asarray(attn)
  np.testing.assert_allclose(np.asarray(l1)[m], np.asarray(l0)[m], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_fused_linear_in_both_kernel_layouts_and_cached_decode(monkeypatch):
  monkeypatch.setattr(cpu_kernels, "FUSE_MIN_ROWS", 1)
  plain, fused = _model(False), _model(True)
  nnx.update(fused, nnx.state(plain))
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.normal(size=(B, 5, 64)), jnp.float32)
  attn = plain.model.layers[0].self_attn
  for p in (attn.q_proj, attn.k_proj, attn.v_proj):
    p.bias.set_value(jnp.asarray(rng.normal(size=p.bias.shape), jnp.float32))
  want = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
  for layout in ("in_out", "out_in"):
    set_kernel_layout(plain, layout)
    got = fused_linear(x, (attn.q_proj, attn.k_proj, attn.v_proj))
    for g, w in zip(got, want):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
  # decode through a KV cache, the sampler's [out, in] layout, fused vs separate
  nnx.update(fused, nnx.state(set_kernel_layout(plain, "in_out")))
  ids = jnp.asarray(rng.integers(0, V, (B, 6)), jnp.int32)
  outs = []
  for model in (plain, fused):
    set_kernel_layout(model, "out_in")
    cache = model.init_cache(B, 8)
    logits, cache = model(
      ids[:, :5], cache=cache, cache_index=0, attention_mask=jnp.arange(8)[None] < 5 * jnp.ones((B, 1))
    )
    step, _ = model(ids[:, 5:], cache=cache, cache_index=5, attention_mask=jnp.arange(8)[None] < 6 * jnp.ones((B, 1)))
    outs.append((logits, step))
  for a, b in zip(outs[0], outs[1]):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("in_out", [True, False])
def test_dense_custom_vjp_equals_autodiff_of_dot_general(in_out):
  """cpu_kernels.dense (its weight gradient written as one 2-D token-contracting GEMM) against
  jax.grad of the plain dot_general, both kernel layouts, [B, T, in] input, random values."""
  from agentfly_jax.models.cpu_kernels import dense

  rng = np.random.default_rng(int(in_out))
  x = jnp.asarray(rng.normal(size=(3, 7, 12)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(12, 20) if in_out else (20, 12)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(3, 7, 20)), jnp.float32)
  plain = lambda x, k: jax.lax.dot_general(
    x,
    k,
    (((2,), (0 if in_out else 1,)), ((), ())),  # noqa: E731
    precision="highest",
  )
  ours = lambda x, k: dense(x, k, in_out, "highest")  # noqa: E731
  np.testing.assert_allclose(np.asarray(ours(x, k)), np.asarray(plain(x, k)), rtol=1e-6, atol=1e-6)
  ga = jax.grad(lambda x, k: (ours(x, k) * g).sum(), argnums=(0, 1))(x, k)
  gb = jax.grad(lambda x, k: (plain(x, k) * g).sum(), argnums=(0, 1))(x, k)
  for a, b in zip(ga, gb):
    assert a.shape == b.shape
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_the_plain_path_equals_the_cpu_kernels(monkeypatch):
  """The model with the CPU kernels switched off (one dot_general per Linear, autodiff's backward, no
  fused projections) gives the logits and parameter gradients of the model with them on, on random
  weights and ids; the switch decides at trace time, so each side is traced under its own setting."""
  monkeypatch.setattr(cpu_kernels, "FUSE_MIN_ROWS", 1)  # the kernels' side fuses at these shapes
  model = _model(True)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  ids = jnp.asarray(np.random.default_rng(5).integers(0, V, (B, T)), jnp.int32)
  w = jnp.asarray(np.random.default_rng(6).normal(size=(B, T, V)), jnp.float32)

  def loss(p):
    return (nnx.merge(graphdef, p, rest)(ids).astype(jnp.float32) * w).sum()

  got = {}
  for flag in (True, False):
    with cpu_kernels.forced(flag):
      assert cpu_kernels.active() is flag
      got[flag] = jax.value_and_grad(loss)(params)
  np.testing.assert_allclose(float(got[False][0]), float(got[True][0]), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got[True][1]), jax.tree.leaves(got[False][1])):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=2e-5)
  with cpu_kernels.forced(False):
    assert cpu_kernels.decode_layout() == "in_out" and not cpu_kernels.fuses(jnp.zeros((4, 300, 8)), True)
  monkeypatch.setenv("AGENTFLY_CPU_KERNELS", "0")
  assert not cpu_kernels.active()
  monkeypatch.setenv("AGENTFLY_CPU_KERNELS", "1")
  assert cpu_kernels.active() and cpu_kernels.decode_layout() == "out_in"
