"""The engine's two jitted programs over the paged KV cache: a prefill chunk and a block of decode steps.

    first, first_lp, cache = prefill_chunk(graphdef, params, rest, cache, tokens, positions, valid, tables, ...)
    toks, lps, emitted, stopped, cache = decode_block(graphdef, params, rest, cache, tokens, positions, ...)
    first, first_lp, cache, experts = prefill_chunk(..., routed=routed)    # a mixture-of-experts model
    toks, lps, emitted, stopped, cache, experts = decode_block(...)        # likewise
    features = image_features(graphdef, params, rest, pixel_values, layout)   # an image request, once

Shapes are static per engine: a few prefill shapes (R rows x C chunk tokens), a few decode batch sizes, one
block-table width (attention visits only the blocks of pages in use: models/paged_attention.paged_attend), K
decode steps per call, the stop-id width; a change of request mix changes none of them, so the
programs compile once each (`TRACES[0]` counts traces). The cache is donated: pages update in place; on a mesh
it leaves each program with the sharding it came in with (`constrain_cache`: kv heads by act_kv_heads, pages whole).

Routes (a mixture-of-experts model only; a dense model's programs are the ones above, unchanged): each
program also returns the experts every sparse layer sent each token it fed to, and a prefill chunk takes
`routed`, recorded routes to replay (a recomputed token keeps the routes it was first computed with; -1 = none
recorded: the router's own top k, models/moe.route).

Randomness: token i of a request (i = 0 for the token sampled from the prompt's last position) is drawn with
`fold_in(key(seed), i)`, the JAX sampler's convention (sampling/decode.py), so a seeded request gives the same
tokens whichever slot, batch or chunking it runs in, and after a preemption.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from agentfly_jax.models.paged_attention import PageTable, constrain_cache
from agentfly_jax.models.sharding import activation_sharding
from agentfly_jax.sampling.next_token import sample_next_tokens

TRACES = [0]  # traces of the programs here (each is one compilation)


def _sample(logits, temperature, top_k, top_p, seeds, steps):
  """One token per row from logits float32[B, V] with row keys fold_in(key(seed), step)."""
  keys = jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(seeds, steps)
  return sample_next_tokens(logits, temperature, top_k, top_p, keys)


@functools.partial(
  jax.jit, static_argnums=(0,), static_argnames=("page_size", "block_pages", "activation"), donate_argnums=(3,)
)
def prefill_chunk(
  graphdef,
  params,
  rest,
  cache,
  tokens,
  positions,
  valid,
  block_tables,
  last_index,
  temperature,
  top_k,
  top_p,
  seeds,
  steps,
  rope_positions=None,
  image_embeds=None,
  image_mask=None,
  routed=None,
  *,
  page_size: int,
  block_pages: int,
  activation=None,
):
  """Writes a chunk of R rows' tokens into their pages and samples each row's next token.

  Args:
    tokens / positions int32[R, C] (positions: cache slots), valid bool[R, C] (False: padding); block_tables
    int32[R, P]; last_index int32[R]: the chunk column whose logits are sampled (the row's last valid token);
    temperature / top_p float32[R], top_k int32[R], seeds uint32[R], steps int32[R] (the token index drawn);
    a chunk holding an image request's tokens (a vision-language model; None otherwise, the text program):
    rope_positions int32[3, R, C] (M-RoPE), image_embeds float[R, C, D] taken where image_mask bool[R, C];
    routed int32[R, C, Lm, k] (a mixture-of-experts model): each token's recorded experts per sparse layer,
    -1 where none is recorded.
  Returns:
    (token int32[R], logprob float32[R], cache), and for a mixture-of-experts model the experts each token was
    routed to, int32[R, C, Lm, k]. Rows whose prompt continues past the chunk ignore their token.
  """
  TRACES[0] += 1
  mesh, rules = activation or (None, None)
  images = {}
  if rope_positions is not None:
    images = dict(positions=rope_positions, image_embeds=image_embeds, image_mask=image_mask)
  with activation_sharding(mesh, None if rules is None else dict(rules)):
    model = nnx.merge(graphdef, params, rest)
    table = PageTable.build(block_tables, positions, valid, page_size, block_pages)
    moe = getattr(model.config, "is_moe", False)
    if moe:
      replay = None if routed is None else jnp.moveaxis(routed, 2, 0)  # [R, C, Lm, k] -> [Lm, R, C, k]
      hidden, cache, routes = model.hidden_states(
        tokens, cache=cache, pages=table, routed_experts=replay, with_router=True, **images
      )
    else:
      hidden, cache = model.hidden_states(tokens, cache=cache, pages=table, **images)
    cache = constrain_cache(cache)
    last = jnp.take_along_axis(hidden, last_index[:, None, None], axis=1)[:, 0]
    logits = model.next_token_logits(last).astype(jnp.float32)
    token, logprob = _sample(logits, temperature, top_k, top_p, seeds, steps)
  if moe:
    return token, logprob, cache, jnp.moveaxis(routes.experts, 0, 2)
  return token, logprob, cache


@functools.partial(
  jax.jit,
  static_argnums=(0,),
  static_argnames=("page_size", "block_pages", "num_steps", "activation"),
  donate_argnums=(3,),
)
def decode_block(
  graphdef,
  params,
  rest,
  cache,
  tokens,
  positions,
  block_tables,
  live,
  remaining,
  stop_ids,
  temperature,
  top_k,
  top_p,
  seeds,
  steps,
  rope_delta=None,
  *,
  page_size: int,
  block_pages: int,
  num_steps: int,
  activation=None,
):
  """Up to `num_steps` decode steps of S slots, on device, stopping early when no slot is live.

  Each step feeds every live slot's pending token at its position (writing its key / value), samples the
  next token and records it; a slot stops after a stop id or `remaining` tokens.

  Args:
    tokens int32[S] (the pending token), positions int32[S] (its position), block_tables int32[S, P],
    live bool[S], remaining int32[S] (tokens the slot may still emit), stop_ids int32[S, N] (-1 = none),
    temperature / top_p float32[S], top_k int32[S], seeds uint32[S], steps int32[S] (index of the next token);
    rope_delta int32[S] (a vision-language model; None: text positions = cache positions): a token's RoPE
    position is its cache position + the row's delta (models/qwen25_vl.py).
  Returns:
    (out_tokens int32[S, K], out_logprobs float32[S, K], emitted int32[S], stopped bool[S], cache): slot s
    emitted out_tokens[s, :emitted[s]]; its new pending token is the last of them. A mixture-of-experts model
    also returns the experts each fed token was routed to, int32[S, K, Lm, k]: step j of slot s fed the token
    at position positions[s] + j (for j < emitted[s]).
  """
  TRACES[0] += 1
  mesh, rules = activation or (None, None)
  slots = tokens.shape[0]
  cfg = nnx.merge(graphdef, params, rest).config
  moe = getattr(cfg, "is_moe", False)

  def cond(carry):
    i, live = carry[0], carry[4]
    return (i < num_steps) & jnp.any(live)

  def body(carry):
    i, cache, tok, pos, live, out_t, out_lp, emitted, stopped, *out_r = carry
    model = nnx.merge(graphdef, params, rest)
    table = PageTable.build(block_tables, pos[:, None], live[:, None], page_size, block_pages)
    rope = {} if rope_delta is None else dict(positions=(pos + rope_delta)[:, None])
    if moe:
      hidden, cache, routes = model.hidden_states(tok[:, None], cache=cache, pages=table, with_router=True, **rope)
      out_r = [out_r[0].at[:, i].set(jnp.moveaxis(routes.experts[:, :, 0], 0, 1))]  # [Lm, S, k] -> [S, Lm, k]
    else:
      hidden, cache = model.hidden_states(tok[:, None], cache=cache, pages=table, **rope)
    logits = model.next_token_logits(hidden[:, 0]).astype(jnp.float32)
    new, lp = _sample(logits, temperature, top_k, top_p, seeds, steps + emitted)
    out_t = out_t.at[:, i].set(jnp.where(live, new, 0))
    out_lp = out_lp.at[:, i].set(jnp.where(live, lp, 0.0))
    emitted = emitted + live.astype(jnp.int32)
    hit = live & jnp.any(new[:, None] == stop_ids, axis=-1)
    stopped = stopped | hit
    still = live & ~hit & (emitted < remaining)
    return (
      i + 1,
      cache,
      jnp.where(live, new, tok),
      pos + live.astype(jnp.int32),
      still,
      out_t,
      out_lp,
      emitted,
      stopped,
      *out_r,
    )

  with activation_sharding(mesh, None if rules is None else dict(rules)):
    init = (
      jnp.int32(0),
      cache,
      tokens,
      positions,
      live & (remaining > 0),
      jnp.zeros((slots, num_steps), jnp.int32),
      jnp.zeros((slots, num_steps), jnp.float32),
      jnp.zeros((slots,), jnp.int32),
      jnp.zeros((slots,), bool),
    )
    if moe:
      init = init + (jnp.zeros((slots, num_steps, len(cfg.moe_layers), cfg.num_experts_per_tok), jnp.int32),)
    _, cache, _, _, _, out_t, out_lp, emitted, stopped, *out_r = jax.lax.while_loop(cond, body, init)
    cache = constrain_cache(cache)
  return (out_t, out_lp, emitted, stopped, cache, *out_r)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("activation",))
def image_features(graphdef, params, rest, pixel_values, layout, *, activation=None):
  """The vision tower on one request's images: pixel_values float32[N, patch_dim], layout (vision.vision_layout
  of its grids) -> merged features [N / merge^2, D]. One trace per distinct set of grids."""
  TRACES[0] += 1
  mesh, rules = activation or (None, None)
  with activation_sharding(mesh, None if rules is None else dict(rules)):
    model = nnx.merge(graphdef, params, rest)
    return model.image_features(pixel_values, vision_layout=layout)
