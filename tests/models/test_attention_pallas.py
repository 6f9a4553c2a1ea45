"""attention_impl "pallas" (TPU's Pallas flash-attention kernel, models/pallas_attention.py), run
here in Pallas' TPU interpret mode: the model's logits and every parameter gradient equal the
one-square attention's on fresh random inputs, with right / left padding, packed segments and
GQA; the segment ids it masks by; on a 4-device mesh it runs under shard_map and still agrees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu

from agentfly_jax.models import CausalLM, tiny_config
from agentfly_jax.models.pallas_attention import block_sizes, segment_ids_for

V = 64


def _model(impl, kvh=2, seed=0):
  cfg = tiny_config(
    "qwen3",
    vocab_size=V,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=kvh,
    head_dim=16,
    attention_chunk=0,
    attention_impl=impl,
  )
  return CausalLM(cfg, rngs=nnx.Rngs(seed))


def _loss_and_grads(impl, ids, attn, seg, weights, kvh):
  graphdef, params = nnx.split(_model(impl, kvh))

  def loss(p):
    logits = nnx.merge(graphdef, p)(ids, attention_mask=attn, segment_ids=seg)
    return (jnp.where(attn[..., None], logits, 0.0) * weights).sum(), logits

  with pltpu.force_tpu_interpret_mode():
    (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return value, np.asarray(logits), grads


def _inputs(seed, b, t, packed):
  rng = np.random.default_rng(seed)
  ids = jnp.asarray(rng.integers(0, V, (b, t)), jnp.int32)
  lengths = rng.integers(t // 3, t, b)
  lengths[0] = t
  real = np.arange(t)[None] < lengths[:, None]
  real[1] = real[1][::-1]  # row 1 left-padded
  attn = jnp.asarray(real)
  seg = None
  if packed:
    cut = rng.integers(2, t - 2, b)
    seg = jnp.asarray(np.where(real, 1 + (np.arange(t)[None] >= cut[:, None]), 0), jnp.int32)
  weights = jnp.asarray(rng.normal(size=(b, t, V)), jnp.float32)
  return ids, attn, seg, weights


@pytest.mark.slow
@pytest.mark.parametrize("packed,kvh,t", [(False, 2, 128), (True, 1, 100)])
def test_pallas_attention_matches_one_square(packed, kvh, t):
  """T=100 is padded to the kernel's 128 inside (a segment of its own, sliced off after)."""
  ids, attn, seg, weights = _inputs(7 + kvh, 3, t, packed)
  v0, l0, g0 = _loss_and_grads("flash", ids, attn, seg, weights, kvh)
  v1, l1, g1 = _loss_and_grads("pallas", ids, attn, seg, weights, kvh)
  m = np.asarray(attn)
  np.testing.assert_allclose(l1[m], l0[m], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-4)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=2e-4, err_msg=str(path))


def test_segment_ids_mark_padding_and_keep_segments():
  attn = jnp.asarray([[True, True, False], [False, True, True]])
  seg = jnp.asarray([[1, 2, 0], [0, 1, 1]], jnp.int32)
  np.testing.assert_array_equal(segment_ids_for(attn, None, (2, 3)), [[0, 0, -1], [-1, 0, 0]])
  np.testing.assert_array_equal(segment_ids_for(attn, seg, (2, 3)), [[1, 2, -1], [-1, 1, 1]])
  np.testing.assert_array_equal(segment_ids_for(None, None, (1, 2)), [[0, 0]])


@pytest.mark.parametrize("t,block", [(2048, 512), (768, 256), (384, 128), (128, 128)])
def test_block_sizes_divide_the_length(t, block):
  sizes = block_sizes(t)
  assert sizes.block_q == sizes.block_k_major == sizes.block_q_dkv == block
  assert t % sizes.block_q == 0


def test_block_sizes_name_a_length_off_the_lanes():
  with pytest.raises(ValueError, match="length 100 is not a multiple of 128"):
    block_sizes(100)


def test_unknown_attention_impl_is_named():
  with pytest.raises(ValueError, match="attention_impl 'splash'"):
    tiny_config("qwen2", attention_impl="splash")


def test_a_run_with_pallas_attention_off_tpu_is_refused_naming_the_backend():
  from agentfly_jax.rl.config import default_config
  from agentfly_jax.rl.setup import check_backend
  from agentfly_jax.rl.spec import as_spec

  config = default_config()
  config.model.attention_impl = "pallas"
  with pytest.raises(ValueError, match="backend is 'cpu': use --config.model.attention_impl=flash"):
    check_backend(as_spec(config), "cpu")
  check_backend(as_spec(config), "tpu")  # the TPU backend runs it
  config.model.attention_impl = "flash"
  check_backend(as_spec(config), "cpu")
