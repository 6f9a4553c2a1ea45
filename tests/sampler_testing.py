"""Shared helpers for the sampler tests: small random models with peaked next-token
distributions, and a plain (cache-free) greedy / log-prob reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentfly_jax.models import CausalLM, tiny_config


# Prompts of several lengths (token ids) the sampler tests share.
PROMPTS = [[5, 17, 3], [40, 2, 9, 11, 60, 7, 1], [88], [12, 13, 14, 15, 16]]


def make_model(
  model_type: str = "qwen2",
  *,
  tie: bool = False,
  seed: int = 0,
  vocab_size: int = 96,
  logit_scale: float = 8.0,
  kernel_scale: float = 8.0,
) -> CausalLM:
  """A tiny random CausalLM with far-from-uniform next-token distributions.

  The default init (std 0.02) gives near-uniform logits (greedy ties, trivial sampling) and a
  tied model that just repeats its input; scaling the embedding / lm_head by `logit_scale` and
  the other kernels by `kernel_scale` gives top-token probabilities of about 0.1-0.6.
  """
  cfg = tiny_config(model_type, vocab_size=vocab_size, tie_word_embeddings=tie)
  model = CausalLM(cfg, rngs=nnx.Rngs(seed))

  def scale(path, x):
    name = jax.tree_util.keystr(path)
    if "embed_tokens" in name or "lm_head" in name:
      return x * logit_scale
    return x * kernel_scale if "kernel" in name else x

  nnx.update(model, jax.tree_util.tree_map_with_path(scale, nnx.state(model, nnx.Param)))
  return model


_FORWARDS = {}


def full_logits(model, ids, pad_to: int = 64) -> np.ndarray:
  """float64[T, V] logits of the cache-free forward pass on one sequence.

  The sequence is right-padded to a multiple of `pad_to` (causal attention: padding after the
  last token changes nothing before it) so one jitted function serves every length.
  """
  key = id(model)
  if key not in _FORWARDS:
    graphdef, state = nnx.split(model)
    _FORWARDS[key] = (model, jax.jit(lambda state, x: nnx.merge(graphdef, state)(x)), state)
  _, forward, state = _FORWARDS[key]
  n = len(ids)
  padded = np.zeros((1, -(-n // pad_to) * pad_to), np.int32)
  padded[0, :n] = ids
  return np.asarray(forward(state, padded)[0, :n], np.float64)


def log_softmax64(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def reference_greedy(model, prompt, num_new: int) -> list[int]:
  """Greedy continuation by re-running the full forward pass for every new token."""
  ids = list(prompt)
  for _ in range(num_new):
    ids.append(int(np.argmax(full_logits(model, ids)[-1])))
  return ids[len(prompt) :]


def truncated_log_softmax64(logits, temperature, top_k, top_p):
  """float64 reference of `next_token`'s convention: logits / T, top-k (ties kept), then top-p on
  the renormalised top-k distribution. Returns (log-probs float64[V] with -inf outside, kept bool[V])."""
  z = np.asarray(logits, np.float64) / temperature
  order = np.argsort(-z, kind="stable")
  keep = np.zeros(z.shape, bool)
  k = top_k if 0 < top_k < z.size else z.size
  kth = z[order[k - 1]]
  in_k = z >= kth
  p = np.exp(z - z.max()) * in_k
  p /= p.sum()
  mass_above = 0.0
  for i in order:
    if not in_k[i]:
      break
    if mass_above < top_p or mass_above == 0.0:
      keep[i] = True
    mass_above += p[i]
  zz = np.where(keep, z, -np.inf)
  return log_softmax64(zz), keep


class RecordingSampler:
  """Wraps a sampler and records (prompt, result) per request."""

  def __init__(self, inner):
    self.inner, self.calls = inner, []

  async def agenerate(self, prompt, params):
    result = await self.inner.agenerate(prompt, params)
    self.calls.append((list(prompt), result))
    return result
