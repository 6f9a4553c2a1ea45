"""Query-chunked causal attention (ModelConfig.attention_chunk, blocks under jax.checkpoint)
equals the one-square attention: logits and parameter gradients of a random loss, with padding
and with packed segments, on random inputs; the config rejects a bad chunk."""
import numpy as np
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from agentfly_jax.models import CausalLM, tiny_config

B, T, V = 3, 13, 64


def _model(chunk):
  cfg = tiny_config("qwen3", vocab_size=V, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, attention_chunk=chunk)
  return CausalLM(cfg, rngs=nnx.Rngs(0))


def _loss_and_grads(chunk, ids, attn, seg, weights):
  graphdef, params = nnx.split(_model(chunk))

  def loss(p):
    logits = nnx.merge(graphdef, p)(ids, attention_mask=attn, segment_ids=seg)
    return (jnp.where(attn[..., None], logits, 0.0) * weights).sum(), logits

  (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return value, logits, grads


@pytest.mark.parametrize("packed", [False, True])
def test_chunked_attention_matches_one_square(packed):
  rng = np.random.default_rng(int(packed))
  ids = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
  attn = jnp.asarray(np.arange(T)[None] < np.array([T, 9, 5])[:, None])
  seg = jnp.asarray(np.where(np.asarray(attn), 1 + (np.arange(T)[None] >= np.array([6, 4, 2])[:, None]), 0),
                    jnp.int32) if packed else None
  weights = jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32)
  v0, l0, g0 = _loss_and_grads(0, ids, attn, seg, weights)
  v1, l1, g1 = _loss_and_grads(4, ids, attn, seg, weights)
  m = np.asarray(attn)
  np.testing.assert_allclose(np.asarray(l1)[m], np.asarray(l0)[m], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)


def test_attention_chunk_must_be_non_negative():
  with pytest.raises(ValueError, match="attention_chunk"):
    tiny_config("llama", attention_chunk=-1)
