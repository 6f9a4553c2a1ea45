"""A prefill into an empty KV cache (`hidden_states(..., from_empty_cache=True)`, the JAX sampler's
prefill) attends among the prompt's tokens with the training attention (flash blocks, the plain
square, checkpointed blocks, the Pallas kernel interpreted) instead of over every cache slot, and
equals the plain cached call at cache_index 0: the real positions' hidden states, the keys / values
written for them, and the decode steps that follow, on left-padded random prompts, scanned and
unrolled layers, each family."""

import contextlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentfly_jax.models import CausalLM, tiny_config

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

B, P, NEW, V = 3, 11, 4, 61
L = 2  # a stack of layers (each reads its own slice of the cache); more only adds compile time


def _model(family, impl, chunk, scan):
  cfg = tiny_config(
    family,
    vocab_size=V,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_hidden_layers=L,
    attention_impl=impl,
    attention_chunk=chunk,
    scan_layers=scan,
  )
  return CausalLM(cfg, rngs=nnx.Rngs(7))


def _interpret(impl):
  if impl != "pallas":
    return contextlib.nullcontext()
  from jax.experimental.pallas import tpu as pltpu

  return pltpu.force_tpu_interpret_mode()  # the TPU kernel, interpreted on this CPU


@nnx.jit
def _step(model, token, pos, cache, index, kv_mask):
  """One decode step: one program per model, shared by the reference and the fresh prefill's decode."""
  return model(token, positions=pos, attention_mask=kv_mask, cache=cache, cache_index=index)


def _prefill_then_decode(model, ids, positions, kv_mask, cont, fresh):
  """(prompt hidden states, cache after the prompt, logits of NEW decode steps)."""

  @nnx.jit
  def prefill(model, cache):
    if fresh:
      return model.hidden_states(ids, positions=positions, attention_mask=kv_mask, cache=cache, from_empty_cache=True)
    return model.hidden_states(ids, positions=positions, attention_mask=kv_mask, cache=cache, cache_index=jnp.int32(0))

  hidden, cache = prefill(model, model.init_cache(B, P + NEW))
  prompt_cache = cache
  logits = []
  last = positions[:, -1:]
  for j in range(NEW):
    out, cache = _step(model, cont[:, j : j + 1], last + 1 + j, cache, jnp.int32(P + j), kv_mask)
    logits.append(np.asarray(out[:, 0]))
  return np.asarray(hidden), prompt_cache, np.stack(logits, 1)


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize(
  "family,impl,chunk",
  [("qwen2", "flash", 4), ("qwen3", "flash", 0), ("llama", "checkpoint", 4), ("qwen3", "pallas", 0)],
)
def test_prefill_from_empty_cache_equals_the_cached_prefill(family, impl, chunk, scan):
  rng = np.random.default_rng(hash((family, impl, scan)) % 2**32)
  lengths = [P, 6, 1]  # left-padded prompts, one of a single token
  ids = np.zeros((B, P), np.int32)
  kv_mask = np.zeros((B, P + NEW), bool)
  for b, n in enumerate(lengths):
    ids[b, P - n :] = rng.integers(0, V, n)
    kv_mask[b, P - n :] = True
  positions = np.maximum(np.cumsum(kv_mask[:, :P], 1) - 1, 0).astype(np.int32)
  cont = rng.integers(0, V, (B, NEW)).astype(np.int32)
  model = _model(family, impl, chunk, scan)
  args = (jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(kv_mask), jnp.asarray(cont))
  with _interpret(impl):
    if impl == "pallas":  # the cached path has no kernel: its reference is the same model on "flash"
      ref_model = _model(family, "flash", 0, scan)
      nnx.update(ref_model, nnx.state(model))
      ref = _prefill_then_decode(ref_model, *args, fresh=False)
    else:
      ref = _prefill_then_decode(model, *args, fresh=False)
    got = _prefill_then_decode(model, *args, fresh=True)
  real = kv_mask[:, :P]
  np.testing.assert_allclose(got[0][real], ref[0][real], rtol=2e-5, atol=2e-5)
  for layer in range(L):
    for name in ("keys", "values"):
      a = np.asarray(getattr(got[1], name)(layer)).transpose(0, 2, 1, 3)  # [B, S, KVH, hd]
      b = np.asarray(getattr(ref[1], name)(layer)).transpose(0, 2, 1, 3)
      np.testing.assert_allclose(a[:, :P][real], b[:, :P][real], rtol=2e-5, atol=2e-5)
      assert not np.any(a[:, P:])  # slots past the prompt stay empty
  np.testing.assert_allclose(got[2], ref[2], rtol=2e-5, atol=2e-5)
  assert np.abs(ref[2]).max() > 0.1  # a real signal, not zeros


def test_from_empty_cache_refuses_an_index_and_a_prompt_longer_than_the_cache():
  model = _model("qwen2", "flash", 4, True)
  ids = jnp.zeros((2, 5), jnp.int32)
  with pytest.raises(ValueError, match="from_empty_cache writes slots"):
    model.hidden_states(ids, cache=model.init_cache(2, 8), cache_index=jnp.int32(0), from_empty_cache=True)
  with pytest.raises(ValueError, match="5 tokens do not fit a cache of 4 slots"):
    model.hidden_states(ids, cache=model.init_cache(2, 4), from_empty_cache=True)
