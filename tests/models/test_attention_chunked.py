"""Query-chunked causal attention (ModelConfig.attention_chunk; attention_impl "flash": custom VJP
from the softmax statistics, "checkpoint": blocks under jax.checkpoint) equals the one-square
attention: logits and parameter gradients of a random loss through the model, with padding and
with packed segments; the flash op against `layers.attend` on its own (values and q/k/v
gradients, GQA, uneven blocks, left/right padding, segments); attention_impl "pallas" (the TPU
kernel, interpreted) equals it too; the config rejects a bad chunk or implementation."""

import functools

import numpy as np
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from agentfly_jax.models import CausalLM, tiny_config

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

B, T, V = 3, 13, 64


def _model(chunk, impl="flash", kvh=2):
  # One decoder layer: the attention's values and its q/k/v gradients (into the projections and the
  # embedding below them) are all compared there; a second layer only adds compile time.
  cfg = tiny_config(
    "qwen3",
    vocab_size=V,
    num_hidden_layers=1,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=kvh,
    head_dim=16,
    attention_chunk=chunk,
    attention_impl=impl,
  )
  return CausalLM(cfg, rngs=nnx.Rngs(0))


def _loss_and_grads(chunk, ids, attn, seg, weights, impl="flash", kvh=2):
  graphdef, params = nnx.split(_model(chunk, impl, kvh))

  def loss(p):
    logits = nnx.merge(graphdef, p)(ids, attention_mask=attn, segment_ids=seg)
    return (jnp.where(attn[..., None], logits, 0.0) * weights).sum(), logits

  if impl != "pallas":
    (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return value, logits, grads
  from jax.experimental.pallas import tpu as pltpu

  with pltpu.force_tpu_interpret_mode():  # the TPU kernel, interpreted on this CPU
    (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return value, logits, grads


_ONE_SQUARE = {}


def _one_square(packed, ids, attn, seg, weights):
  """The one-square model's (loss, logits, grads) on a `packed` case's inputs (they depend on
  `packed` only): computed once, shared by every chunked implementation compared with it."""
  if packed not in _ONE_SQUARE:
    _ONE_SQUARE[packed] = _loss_and_grads(0, ids, attn, seg, weights)
  return _ONE_SQUARE[packed]


@pytest.mark.slow
@pytest.mark.parametrize("impl,chunk", [("flash", 4), ("flash", 64), ("checkpoint", 4)])
@pytest.mark.parametrize("packed", [False, True])
def test_chunked_attention_matches_one_square(packed, impl, chunk):
  rng = np.random.default_rng(int(packed))
  ids = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
  attn = jnp.asarray(np.arange(T)[None] < np.array([T, 9, 5])[:, None])
  seg = (
    jnp.asarray(np.where(np.asarray(attn), 1 + (np.arange(T)[None] >= np.array([6, 4, 2])[:, None]), 0), jnp.int32)
    if packed
    else None
  )
  weights = jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32)
  v0, l0, g0 = _one_square(packed, ids, attn, seg, weights)
  v1, l1, g1 = _loss_and_grads(chunk, ids, attn, seg, weights, impl)
  m = np.asarray(attn)
  np.testing.assert_allclose(np.asarray(l1)[m], np.asarray(l0)[m], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)


def _pallas_inputs(seed, b, t, packed):
  """Right padding (rows 2+), left padding (row 1), a full row (row 0); two segments when packed."""
  rng = np.random.default_rng(seed)
  ids = jnp.asarray(rng.integers(0, V, (b, t)), jnp.int32)
  lengths = rng.integers(t // 3, t, b)
  lengths[0] = t
  real = np.arange(t)[None] < lengths[:, None]
  real[1] = real[1][::-1]
  seg = None
  if packed:
    cut = rng.integers(2, t - 2, b)
    seg = jnp.asarray(np.where(real, 1 + (np.arange(t)[None] >= cut[:, None]), 0), jnp.int32)
  return ids, jnp.asarray(real), seg, jnp.asarray(rng.normal(size=(b, t, V)), jnp.float32)


@pytest.mark.slow
@pytest.mark.parametrize("packed,kvh,t", [(False, 2, 128), (True, 1, 100)])
def test_pallas_attention_matches_one_square(packed, kvh, t):
  """attention_impl "pallas" (models/pallas_attention.py, Pallas' TPU interpret mode here): logits
  and every parameter gradient equal the one-square model's; T=100 is padded to the kernel's 128
  inside (a segment of its own, sliced off after)."""
  ids, attn, seg, weights = _pallas_inputs(7 + kvh, 3, t, packed)
  v0, l0, g0 = _loss_and_grads(0, ids, attn, seg, weights, "flash", kvh)
  v1, l1, g1 = _loss_and_grads(0, ids, attn, seg, weights, "pallas", kvh)
  m = np.asarray(attn)
  np.testing.assert_allclose(np.asarray(l1)[m], np.asarray(l0)[m], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-4)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=2e-4, err_msg=str(path))


def test_attention_chunk_must_be_non_negative():
  with pytest.raises(ValueError, match="attention_chunk"):
    tiny_config("llama", attention_chunk=-1)


@functools.partial(jax.jit, static_argnums=0)
def _values_and_grads(attention, q, k, v, mask, d_out):
  """(sum(attention(q, k, v, mask) * d_out), the output, its q/k/v gradients): one program per
  `attention` and shapes, the random q/k/v/mask/d_out its arguments, not constants."""

  def loss(q, k, v):
    out = attention(q, k, v, mask)
    return (out * d_out).sum(), out

  (val, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return val, out, grads


@functools.cache
def _attend(kvh):
  """layers.attend at float32 / highest precision, one object per KV-head count: the reference
  program compiles once for every chunk compared with it."""
  from agentfly_jax.models import layers

  return functools.partial(
    layers.attend, num_kv_heads=kvh, keys_transposed=False, dtype=jnp.float32, precision="highest"
  )


@pytest.mark.parametrize("chunk", [5, 16, 24, 64])
@pytest.mark.parametrize("kvh", [1, 2])
def test_flash_attention_op_matches_attend_values_and_grads(chunk, kvh):
  """layers.attend vs flash_causal_attention on fresh random q/k/v: right padding (row 0), left
  padding (row 1: keys 0-3 masked, so queries 0-3 see nothing), two packed segments (row 2).
  Rows with no allowed key are the documented exception (uniform over the block's keys), so the
  upstream gradient is zero there and their outputs are not compared."""
  from agentfly_jax.models.flash_attention import flash_causal_attention

  b, t, h, hd = 3, 24, 6, 8
  rng = np.random.default_rng(chunk * 10 + kvh)
  q = jnp.asarray(rng.normal(size=(b, t, h, hd)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(b * kvh, t, hd)) * 2, jnp.float32)
  v = jnp.asarray(rng.normal(size=(b * kvh, t, hd)), jnp.float32)
  m = np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, t, t)).copy()
  m[0, :, 17:] = False  # right padding
  m[1, :, :4] = False  # left padding
  m[2, 10:, :10] = False  # second packed segment starts at 10
  mask = jnp.asarray(m)
  seen = m.any(-1)  # [b, t] rows with at least one allowed key
  d_out = jnp.asarray(rng.normal(size=(b, t, h * hd)) * seen[..., None], jnp.float32)

  ref = _values_and_grads(_attend(kvh), q, k, v, mask, d_out)
  got = _values_and_grads(
    functools.partial(flash_causal_attention, num_kv_heads=kvh, chunk=chunk, dtype=jnp.float32, precision="highest"),
    q,
    k,
    v,
    mask,
    d_out,
  )
  np.testing.assert_allclose(np.asarray(got[1])[seen], np.asarray(ref[1])[seen], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(float(got[0]), float(ref[0]), rtol=1e-5)
  for name, a, r in zip("qkv", got[2], ref[2]):
    assert float(jnp.abs(r).max()) > 1e-3, name  # the comparison is not of zeros
    np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-4, atol=1e-5, err_msg=f"d{name}")
  if chunk >= t:  # one block: every row, the padded ones included, equals attend
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(ref[1]), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_flash_attention_bfloat16_tracks_float32():
  """The bf16 compute path (GPU recipe) stays within bf16 rounding of the float32 result."""
  from agentfly_jax.models.flash_attention import flash_causal_attention

  b, t, h, kvh, hd = 2, 32, 4, 2, 16
  rng = np.random.default_rng(7)
  q = jnp.asarray(rng.normal(size=(b, t, h, hd)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(b * kvh, t, hd)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b * kvh, t, hd)), jnp.float32)
  mask = jnp.asarray(np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, t, t)))

  def grads(dtype):
    f = lambda q, k, v: (
      flash_causal_attention(
        q.astype(dtype),
        k.astype(dtype),
        v.astype(dtype),
        mask,  # noqa: E731
        num_kv_heads=kvh,
        chunk=8,
        dtype=dtype,
      )
      .astype(jnp.float32)
      .sum()
    )
    return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)  # one program per dtype, not op by op

  for a, r in zip(grads(jnp.bfloat16), grads(jnp.float32)):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=0.05 * float(jnp.abs(r).max()))


def test_attention_impl_must_be_known():
  with pytest.raises(ValueError, match="attention_impl"):
    tiny_config("llama", attention_impl="splash")
  from agentfly_jax.rl.config import default_config, validate_config

  c = default_config()
  c.model.attention_impl = "sdpa"
  with pytest.raises(ValueError, match="model.attention_impl"):
    validate_config(c)
