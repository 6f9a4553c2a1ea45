"""float32 params under bfloat16 compute: the scanned layers cast each layer's weights inside the
loop (`tied_to_iteration`, so XLA keeps no bfloat16 copy of the whole stack) and the embedding rows
are gathered from the float32 table (`embed_lookup`); both exact, and the scanned mixed-precision
model equals the unrolled one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentfly_jax.models import CausalLM, tiny_config
from agentfly_jax.models.causal_lm import embed_lookup, tied_to_iteration
from agentfly_jax.models.layer_stack import stack_layers

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


def test_tied_to_iteration_is_exact_in_values_and_gradients():
  rng = np.random.default_rng(0)
  state = {
    "w": jnp.asarray(rng.normal(size=(5, 3)) * 1e3, jnp.float32),
    "b": jnp.asarray(rng.normal(size=(3,)), jnp.bfloat16),
    "ids": jnp.arange(4, dtype=jnp.int32),
  }
  for index in (0, 7):
    tied = tied_to_iteration(state, jnp.int32(index), jnp.bfloat16)
    np.testing.assert_array_equal(tied["w"], state["w"])
    assert tied["w"].dtype == jnp.float32
    assert tied["b"] is state["b"] and tied["ids"] is state["ids"]  # compute dtype / ints: untouched
  cot = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
  grad = jax.grad(lambda w, i: jnp.sum(tied_to_iteration({"w": w}, i, jnp.bfloat16)["w"] * cot))(
    state["w"], jnp.int32(3)
  )
  np.testing.assert_array_equal(grad, cot)


def test_embed_lookup_equals_nnx_embed_and_sums_gradients_in_float32():
  emb = nnx.Embed(50, 8, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(1))
  ids = jax.random.randint(jax.random.key(2), (3, 40), 0, 50)
  got = embed_lookup(emb, ids, jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(got, emb(ids))
  cot = jax.random.normal(jax.random.key(3), (3, 40, 8), jnp.float32)
  _, vjp = jax.vjp(lambda t: jnp.take(t, ids, axis=0).astype(jnp.bfloat16), emb.embedding[...])
  (grad,) = vjp(cot.astype(jnp.bfloat16))
  want = np.zeros((50, 8), np.float64)
  np.add.at(want, np.asarray(ids).reshape(-1), np.asarray(cot.astype(jnp.bfloat16), np.float64).reshape(-1, 8))
  assert grad.dtype == jnp.float32
  np.testing.assert_allclose(grad, want, rtol=1e-6, atol=1e-6)  # float32 sums, not bfloat16 ones
  try:
    embed_lookup(emb, ids.astype(jnp.float32), jnp.bfloat16)
  except ValueError as e:
    assert "input_ids must be integers" in str(e)
  else:
    raise AssertionError("float ids were accepted")


def _rel_err(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.slow
def test_scanned_mixed_precision_equals_unrolled(monkeypatch):
  cfg = tiny_config(
    "qwen2",
    vocab_size=211,
    num_hidden_layers=3,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    initializer_range=0.2,
    tie_word_embeddings=False,
    dtype="bfloat16",
    param_dtype="float32",
    remat="full",
  )
  unrolled = CausalLM(cfg, rngs=nnx.Rngs(4))
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: CausalLM(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0))))
  scanned = nnx.merge(graphdef, stack_layers(nnx.state(unrolled)))
  ids = jax.random.randint(jax.random.key(5), (2, 13), 0, cfg.vocab_size)
  weights = jax.random.normal(jax.random.key(6), (2, 13, cfg.vocab_size))

  def logits_and_grads(model):  # a new jit each call: traced again (the monkeypatch below)
    def loss(m):
      logits = m(ids)
      return jnp.mean(logits.astype(jnp.float32) * weights), logits

    return nnx.jit(lambda m: nnx.grad(loss, has_aux=True)(m))(model)

  g_unrolled, logits_unrolled = logits_and_grads(unrolled)
  g_scanned, logits_scanned = logits_and_grads(scanned)
  # bfloat16 compute: XLA fuses the scanned and the unrolled programs differently (the same few
  # logits differ by a few bfloat16 ulps without the tie too), so compare as relative errors
  assert _rel_err(logits_scanned, logits_unrolled) < 1e-2
  want = dict(nnx.to_flat_state(stack_layers(nnx.state(g_unrolled))))
  got = dict(nnx.to_flat_state(nnx.state(g_scanned)))
  assert got.keys() == want.keys()
  for path, g in got.items():
    assert g[...].dtype == jnp.float32 and np.abs(np.asarray(want[path][...])).max() > 0, path
    # a key bias's true gradient is 0 (it shifts every score of a query alike): rounding noise only
    tol = 0.2 if path[-2:] == ("k_proj", "bias") else 3e-2
    assert _rel_err(g[...], want[path][...]) < tol, "/".join(map(str, path))
  # the tie itself changes nothing: the same scanned program without it gives the same bits
  from agentfly_jax.models import causal_lm

  monkeypatch.setattr(causal_lm, "tied_to_iteration", lambda state, index, dtype: state)
  g_untied, logits_untied = logits_and_grads(scanned)
  np.testing.assert_array_equal(np.asarray(logits_untied, np.float32), np.asarray(logits_scanned, np.float32))
  for path, g in dict(nnx.to_flat_state(nnx.state(g_untied))).items():
    np.testing.assert_array_equal(g[...], got[path][...], err_msg="/".join(map(str, path)))
