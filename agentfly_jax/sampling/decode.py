"""The JAX sampler's jitted programs: prefill + KV-cache decode of one padded batch.

    tokens, logprobs, num_new, stopped = generate_rows(graphdef, params, rest, ids, lens, ...)
    tokens, logprobs, num_new, stopped, cache = generate_rows_from_cache(graphdef, params, rest, cache, ...)

`generate_rows` prefills left-padded prompts into an empty cache. `generate_rows_from_cache`
starts from a cache that already holds each row's prefix (sampling/prefix_cache.py lays it out)
and prefills only the suffix, so a multi-turn chain's next prompt costs its new tokens only.
Both run the same decode loop (`lax.while_loop` that exits when every row is done). Jitted at
module level with the model's graphdef static, so every sampler of one architecture shares the
compiled code; `TRACES[0]` counts the traces (each is one compilation).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from agentfly_jax.models.sharding import activation_sharding
from agentfly_jax.models.token_stats import suppress_logits
from agentfly_jax.sampling.next_token import sample_next_tokens

TRACES = [0]  # how many times a program here was traced (each trace is one compilation)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("num_new_bucket", "activation", "return_cache"))
def generate_rows(
  graphdef,
  params,
  rest,
  prompt_ids,
  prompt_lens,
  temperature,
  top_k,
  top_p,
  max_new,
  stop_ids,
  seeds,
  *,
  num_new_bucket: int,
  activation=None,
  return_cache: bool = False,
):
  """Prefill + decode for one padded batch.

  Args:
    graphdef: the model's nnx GraphDef (static); params / rest: its nnx.Param state and the rest.
    prompt_ids: int32[B, P] left-padded; prompt_lens int32[B].
    temperature float32[B], top_k int32[B], top_p float32[B], max_new int32[B] (0 = padding
    row), stop_ids int32[B, S] (-1 = none), seeds uint32[B].
    num_new_bucket: static N, the most new tokens any row may take.
    activation (static): None or (mesh, rules as sorted items) for `activation_sharding`.
    return_cache (static): also return the final KVCache (P + N slots; the prompt's valid slots
      are those >= P - prompt_lens, then the fed new tokens from slot P).
  Returns:
    tokens int32[B, N], logprobs float32[B, N], num_new int32[B], stopped bool[B] (+ the cache).
  """
  TRACES[0] += 1
  mesh, rules = activation or (None, None)
  with activation_sharding(mesh, None if rules is None else dict(rules)):
    model = nnx.merge(graphdef, params, rest)
    batch, p_len = prompt_ids.shape
    cache = model.init_cache(batch, p_len + num_new_bucket)
    pad = p_len - prompt_lens
    kv_mask = jnp.arange(p_len + num_new_bucket)[None, :] >= pad[:, None]  # bool[B, P + N]
    positions = jnp.maximum(jnp.arange(p_len)[None, :] - pad[:, None], 0).astype(jnp.int32)
    if hasattr(model, "hidden_states") and hasattr(model, "logits_from_hidden"):
      # Only the last prompt position's logits are needed: skip the lm_head on the others. The
      # prompt attends among itself (no [B, H, P, P + N] scores over the empty cache slots).
      hidden, cache = model.hidden_states(
        prompt_ids, positions=positions, attention_mask=kv_mask, cache=cache, from_empty_cache=True
      )
      last_logits = model.next_token_logits(hidden[:, -1, :])
    else:
      logits, cache = model(
        prompt_ids, positions=positions, attention_mask=kv_mask, cache=cache, cache_index=jnp.int32(0)
      )
      last_logits = logits[:, -1, :]
    out = _decode(
      graphdef, params, rest, cache, last_logits, kv_mask, p_len, prompt_lens,
      temperature, top_k, top_p, max_new, stop_ids, seeds, num_new_bucket,
    )  # fmt: skip
  return out if return_cache else out[:4]


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("num_new_bucket", "activation"), donate_argnums=(3,))
def generate_rows_from_cache(
  graphdef,
  params,
  rest,
  cache,
  kv_mask,
  suffix_ids,
  suffix_positions,
  prompt_lens,
  temperature,
  top_k,
  top_p,
  max_new,
  stop_ids,
  seeds,
  *,
  num_new_bucket: int,
  activation=None,
):
  """Suffix prefill on a cache that holds the rows' prefixes, then decode.

  Args:
    cache: KVCache of P + N slots (donated); each row's cached prefix sits in its valid slots
      before P - U.
    kv_mask: bool[B, P + N], the valid slots: the prefix, the suffix's real tokens, all of [P, P + N).
    suffix_ids: int32[B, U], each row's uncached prompt tail right-aligned in slots [P - U, P).
    suffix_positions: int32[B, U], their RoPE positions (prefix length + index; pads: anything).
    prompt_lens: int32[B], whole prompt lengths (the first new token's position).
    the rest as `generate_rows`.
  Returns:
    tokens int32[B, N], logprobs float32[B, N], num_new int32[B], stopped bool[B], the cache.
  """
  TRACES[0] += 1
  mesh, rules = activation or (None, None)
  with activation_sharding(mesh, None if rules is None else dict(rules)):
    model = nnx.merge(graphdef, params, rest)
    u_len = suffix_ids.shape[1]
    p_len = cache.max_len - num_new_bucket
    hidden, cache = model.hidden_states(
      suffix_ids, positions=suffix_positions, attention_mask=kv_mask, cache=cache, cache_index=jnp.int32(p_len - u_len)
    )
    last_logits = model.next_token_logits(hidden[:, -1, :])
    return _decode(
      graphdef, params, rest, cache, last_logits, kv_mask, p_len, prompt_lens,
      temperature, top_k, top_p, max_new, stop_ids, seeds, num_new_bucket,
    )  # fmt: skip


def _decode(
  graphdef, params, rest, cache, last_logits, kv_mask, p_len, prompt_lens,
  temperature, top_k, top_p, max_new, stop_ids, seeds, n_new,
):  # fmt: skip
  """Samples token 0 from `last_logits` (float[B, V], the prompt's last position), then feeds
  each sampled token at slot p_len + step - 1 (position prompt_lens + step - 1) and samples the
  next, so no forward pass is wasted after the last token. Returns (tokens, logprobs, num_new,
  stopped, cache)."""
  batch = last_logits.shape[0]
  row_keys = jax.vmap(jax.random.key)(seeds)

  def sample_step(step, logits, out_tokens, out_logprobs, done, num_new, stopped):
    """Samples token `step` for the live rows and records it."""
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, step)
    tokens, logprobs = sample_next_tokens(logits, temperature, top_k, top_p, keys)
    live = ~done
    out_tokens = out_tokens.at[:, step].set(jnp.where(live, tokens, 0))
    out_logprobs = out_logprobs.at[:, step].set(jnp.where(live, logprobs, 0.0))
    num_new = num_new + live.astype(jnp.int32)
    hit_stop = live & jnp.any(tokens[:, None] == stop_ids, axis=-1)
    stopped = stopped | hit_stop
    done = done | hit_stop | (num_new >= max_new)
    return tokens, out_tokens, out_logprobs, done, num_new, stopped

  first = sample_step(
    0,
    last_logits.astype(jnp.float32),
    jnp.zeros((batch, n_new), jnp.int32),
    jnp.zeros((batch, n_new), jnp.float32),
    max_new <= 0,
    jnp.zeros((batch,), jnp.int32),
    jnp.zeros((batch,), bool),
  )

  def cond(carry):
    step, done = carry[0], carry[5]  # carry: step, cache, prev tokens, out tokens, logprobs, done, ...
    return (step < n_new) & ~jnp.all(done)

  def body(carry):
    step, cache, prev_tokens, *record = carry
    step_model = nnx.merge(graphdef, params, rest)
    logits, cache = step_model(
      prev_tokens[:, None],
      positions=(prompt_lens + step - 1)[:, None],
      attention_mask=kv_mask,
      cache=cache,
      cache_index=p_len + step - 1,
    )
    placeholders = getattr(getattr(step_model, "config", None), "placeholder_token_ids", ())
    logits = suppress_logits(logits[:, -1, :].astype(jnp.float32), placeholders)
    tokens, *record = sample_step(step, logits, *record)
    return (step + 1, cache, tokens, *record)

  init = (jnp.int32(1), cache, *first)
  _, cache, _, out_tokens, out_logprobs, _, num_new, stopped = jax.lax.while_loop(cond, body, init)
  return out_tokens, out_logprobs, num_new, stopped, cache
