"""CausalLM (policy) and Critic (value model): Flax NNX decoder-only transformers.

    model = CausalLM(cfg, rngs=nnx.Rngs(0))
    logits = model(input_ids)                                   # int32[B,T] -> float32[B,T,V]
    cache = model.init_cache(batch_size, max_len)
    logits, cache = model(ids, positions=pos, attention_mask=kv_mask, cache=cache, cache_index=idx)
    critic = Critic.from_causal_lm(model)                        # values float32[B,T]

Attribute names mirror HF's module tree (model.embed_tokens, model.layers[i].self_attn.q_proj,
..., lm_head) so the HF name table in `hf_io.py` is a plain rename + transpose. With
`cfg.scan_layers` `model.layers` is one DecoderLayer whose variables are stacked on a leading
[num_hidden_layers] axis (logical name "layers"; paths model.layers.self_attn.q_proj.kernel
[L, in, out]), run under `lax.scan` with the remat policy inside the body; its KV cache is stacked
the same way (`KVCache.stacked`). `layer_stack.py` converts states between the layouts.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from agentfly_jax.models.config import ModelConfig
from agentfly_jax.models.kv_cache import KVCache
from agentfly_jax.models.paged_attention import PagedKVCache, PageTable, cache_heads_first
from agentfly_jax.models.decoder_layer import DecoderLayer
from agentfly_jax.models.layers import RMSNorm, linear, position_tables
from agentfly_jax.models.pallas_attention import segment_ids_for
from agentfly_jax.models.remat import checkpointed, scan_body
from agentfly_jax.models.sharding import HIDDEN_AXES, constrain
from agentfly_jax.models.token_stats import (
  at_loss_positions,
  capacity_fractions,
  chunked_logprobs_entropy,
  suppress_logits,
)


def _apply_layer(graphdef, state, x, cos, sin, mask, kv, cache_index, routed=None):
  out = nnx.merge(graphdef, state)(x, cos, sin, mask, kv, cache_index, routed)
  return out if len(out) == 3 else (*out, None)


def segment_positions(segment_ids: jax.Array) -> jax.Array:
  """int32[B, T] position of each token within its segment (0 at each segment's first token),
  for packed rows: segment_ids int[B, T], a run of equal ids is one segment."""
  t = segment_ids.shape[1]
  idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segment_ids.shape)
  starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], 1)
  return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)


def build_attention_mask(
  batch_size: int, num_queries: int, *, attention_mask=None, cache_len=None, cache_index=None, segment_ids=None
) -> jax.Array:
  """bool[B, T, S]: may query t attend to key s.

  Without a cache (S = T): s <= t and attention_mask[b, s] (bool[B, T] padding mask, True = real),
  and with `segment_ids` (int[B, T], packed rows) only within the same segment.
  With a cache of length S: the query at slot cache_index + t sees slot s iff
  s <= cache_index + t and attention_mask[b, s] (bool[B, S], valid cache slots).
  """
  if cache_len is None:
    q_slot = jnp.arange(num_queries)
    key_slot = jnp.arange(num_queries)
  else:
    q_slot = cache_index + jnp.arange(num_queries)
    key_slot = jnp.arange(cache_len)
  allowed = key_slot[None, None, :] <= q_slot[None, :, None]
  allowed = jnp.broadcast_to(allowed, (batch_size, num_queries, key_slot.shape[0]))
  if attention_mask is not None:
    allowed = allowed & attention_mask.astype(bool)[:, None, :]
  if segment_ids is not None:
    allowed = allowed & (segment_ids[:, :, None] == segment_ids[:, None, :])
  return allowed


def stacked_decoder_layers(cfg: ModelConfig, rngs: nnx.Rngs) -> DecoderLayer:
  """One DecoderLayer whose every variable has a leading [num_hidden_layers] axis, logical name
  "layers" (each layer initialised from its own split of `rngs`)."""

  @nnx.split_rngs(splits=cfg.num_hidden_layers)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
  def make(layer_rngs):
    return DecoderLayer(cfg, rngs=layer_rngs)  # ModelConfig.validate: scanned layers are all alike

  return make(rngs)


def scan_decoder_layers(
  layers: DecoderLayer, x, cos, sin, mask, cache, cache_index, remat, compute_dtype=None, routed=None
):
  """Runs the stacked decoder layers over x [B, T, D] with `lax.scan` (one layer per iteration,
  under the remat policy `remat`); `cache`: a stacked KVCache or None. Returns (x, ((k, v) stacked
  [L, ...] or None, RouterOut stacked [L, ...] or None)); `routed` int32[L, B, T, k] replayed
  experts (a mixture-of-experts model) or None.

  Without a cache (training, scoring) each layer's weights are cast to `compute_dtype` inside
  the loop (`tied_to_iteration`); with one (prefill, decode) XLA may cast the whole stack once
  before the loop, which a decode step that reads every weight per token wants."""
  graphdef, state = nnx.split(layers)
  tie = cache is None and compute_dtype is not None

  def body(h, xs):
    layer_state, kv, index, route_in = xs
    if tie:
      layer_state = tied_to_iteration(layer_state, index, compute_dtype)
    out = _apply_layer(graphdef, layer_state, constrain(h, HIDDEN_AXES), cos, sin, mask, kv, cache_index, route_in)
    return out[0], (out[1], out[2])

  kvs = None if cache is None else (cache.k, cache.v)
  num_layers = jax.tree.leaves(state)[0].shape[0]
  return jax.lax.scan(scan_body(body, remat), x, (state, kvs, jnp.arange(num_layers, dtype=jnp.int32), routed))


def scan_paged_layers(layers: DecoderLayer, x, cos, sin, pages, cache, remat, routed=None):
  """The stacked decoder layers over x [B, T, D] and a stacked paged cache k / v [L, ...]: the cache rides in
  the scan's carry and each layer writes and reads its own slice through its index (a scatter and gathers on
  the whole array, in place), so a step moves only the keys it writes and reads. (As scan inputs and outputs
  the stack would be copied whole every step.) `routed`: as scan_decoder_layers. Returns (x, ((k, v), RouterOut
  stacked [L, ...] or None))."""
  graphdef, state = nnx.split(layers)

  def body(carry, xs):
    h, k, v = carry
    layer_state, index, route_in = xs
    h, (k, v), route = _apply_layer(
      graphdef, layer_state, constrain(h, HIDDEN_AXES), cos, sin, pages, (k, v, index), None, route_in
    )
    return (h, k, v), route

  num_layers = jax.tree.leaves(state)[0].shape[0]
  (x, k, v), routes = jax.lax.scan(
    scan_body(body, remat), (x, cache.k, cache.v), (state, jnp.arange(num_layers, dtype=jnp.int32), routed)
  )
  return x, ((k, v), routes)


def embed_lookup(embed: nnx.Embed, input_ids: jax.Array, compute_dtype) -> jax.Array:
  """Rows of the embedding table for int ids [...] -> [..., D] in `compute_dtype`, gathered from the
  table in its own dtype and cast after: `nnx.Embed` casts the whole [V, D] table first, which
  costs a compute-dtype copy of it, and its gradient is then scatter-added in the compute dtype
  (bfloat16 sums of every token's gradient) before the cast back to the param dtype."""
  if not jnp.issubdtype(input_ids.dtype, jnp.integer):
    raise ValueError(f"input_ids must be integers, got {input_ids.dtype}")
  return jnp.take(embed.embedding[...], input_ids, axis=0).astype(compute_dtype)


def tied_to_iteration(layer_state, index: jax.Array, compute_dtype):
  """One scanned layer's variables, those of another float dtype than `compute_dtype` multiplied by
  1.0 computed from the loop index `index` (int32[]), exactly equal and their gradients too.

  Why: XLA (TPU) rewrites "cast the sliced layer's float32 weights to bfloat16 in the loop" into
  "cast the whole [L, ...] stack before the loop", which keeps a compute-dtype copy of every
  layer's weights alive through the forward and backward loops (1.5 GiB a chip for Qwen2.5-7B
  on 8 chips, measured with experiments/aot_compile.py); an optimization barrier does not stop
  it (XLA drops barriers first). A value that depends on the iteration cannot be hoisted, and
  XLA does not fold `float(i) * 0.0` (it would be wrong for inf / nan)."""
  one = index.astype(jnp.float32) * 0.0 + 1.0

  def tie(x):
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == jnp.dtype(compute_dtype):
      return x
    return x * one.astype(x.dtype)

  return jax.tree.map(tie, layer_state)


class Transformer(nnx.Module):
  """Embedding + decoder layers + final norm (HF's `model.*`)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.embed_tokens = nnx.Embed(
      cfg.vocab_size,
      cfg.hidden_size,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.params_dtype,
      embedding_init=nnx.initializers.normal(cfg.initializer_range),
      rngs=rngs,
      embedding_metadata={"out_sharding": ("vocab", "embed"), "eager_sharding": False},
    )  # logical axes
    if cfg.scan_layers:
      self.layers = stacked_decoder_layers(cfg, rngs)
    else:
      self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs, layer_idx=i) for i in range(cfg.num_hidden_layers)])
    self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype)


class _Base(nnx.Module):
  """Shared trunk logic for CausalLM and Critic."""

  config: ModelConfig
  model: Transformer

  def init_cache(self, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """Zero KV cache for `batch_size` rows of `max_len` slots (see KVCache; stacked with
    scan_layers)."""
    cfg = self.config
    return KVCache.zeros(
      cfg.num_hidden_layers,
      batch_size,
      max_len,
      cfg.num_key_value_heads,
      cfg.head_dim,
      dtype or cfg.compute_dtype,
      stacked=cfg.scan_layers,
    )

  def init_paged_cache(self, num_pages: int, page_size: int, dtype=None) -> PagedKVCache:
    """Zero key / value pages (models/paged_attention.py; stacked with scan_layers, heads first with
    attention_impl "pallas")."""
    cfg = self.config
    return PagedKVCache.zeros(
      cfg.num_hidden_layers,
      num_pages,
      page_size,
      cfg.num_key_value_heads,
      cfg.head_dim,
      dtype or cfg.compute_dtype,
      stacked=cfg.scan_layers,
      heads_first=cache_heads_first(cfg.attention_impl),
    )

  def hidden_states(
    self,
    input_ids,
    *,
    positions=None,
    attention_mask=None,
    cache=None,
    cache_index=None,
    segment_ids=None,
    from_empty_cache: bool = False,
    pages: PageTable | None = None,
    routed_experts: jax.Array | None = None,
    with_router: bool = False,
    pixel_values=None,
    image_grid_thw=None,
  ):
    """Final-norm hidden states [B, T, D] (compute dtype) and the new cache (None without one);
    with `with_router` (static) also the sparse layers' routing, a models/moe.py RouterOut stacked
    [Lm, B, T, ...] (Lm = len(config.moe_layers); None for a dense model).

    Args: see `CausalLM.__call__`; `from_empty_cache` (static): `cache` holds nothing yet and
    input_ids fill its slots [0, T) (a prefill): they attend among themselves as without a cache
    (the Pallas kernel / flash blocks, no [B, H, T, S] scores over the whole cache); the result
    equals the plain cached call at cache_index 0. `pages` (with a PagedKVCache `cache`): where each token
    reads and writes (models/paged_attention.py); its positions are the RoPE positions.
    `routed_experts` int32[Lm, B, T, k] (a mixture-of-experts model): the experts each sparse layer
    sends each token to (router replay; the weights still come from the router's probabilities).
    `pixel_values` / `image_grid_thw`: images, only for a vision-language model (models/qwen25_vl.py);
    a text-only model refuses them by name.
    """
    if pixel_values is not None or image_grid_thw is not None:
      raise ValueError(
        f"pixel_values / image_grid_thw were given to a text-only model (model_type {self.config.model_type!r} "
        "has no vision tower); images need a qwen2_5_vl model"
      )
    x, new_cache, routes = self._hidden_states(
      input_ids, positions, attention_mask, cache, cache_index, segment_ids, from_empty_cache, pages, routed_experts
    )
    return (x, new_cache, routes) if with_router else (x, new_cache)

  def _route_inputs(self, routed_experts, b: int, t: int):
    """Per decoder layer: its slice of routed_experts [Lm, B, T, k], or None."""
    cfg = self.config
    n = cfg.num_hidden_layers
    if routed_experts is None:
      return [None] * n
    if not cfg.is_moe:
      raise ValueError("routed_experts (router replay) was given to a dense model")
    chex.assert_shape(routed_experts, (len(cfg.moe_layers), b, t, cfg.num_experts_per_tok))
    slot = {layer: j for j, layer in enumerate(cfg.moe_layers)}
    return [routed_experts[slot[i]] if i in slot else None for i in range(n)]

  def _stack_routes(self, routes):
    """The sparse layers' RouterOuts (unrolled: a list with None at dense layers) stacked, or None."""
    if not self.config.is_moe:
      return None
    from agentfly_jax.models.moe import stacked_routes

    if not isinstance(routes, list):
      return routes
    return stacked_routes([r for r in routes if r is not None])

  def _hidden_states(
    self,
    input_ids,
    positions,
    attention_mask,
    cache,
    cache_index,
    segment_ids,
    from_empty_cache,
    pages,
    routed_experts,
    inputs_embeds=None,
  ):
    """hidden_states' body; `inputs_embeds` [B, T, D] (compute dtype): the input vectors to use in
    place of the embedding rows of input_ids (a vision-language model's, image features scattered in)."""
    chex.assert_rank(input_ids, 2)
    if not jnp.issubdtype(input_ids.dtype, jnp.integer):
      raise TypeError(f"input_ids must be an integer array [B, T], got dtype {input_ids.dtype}")
    b, t = input_ids.shape
    cfg = self.config
    if isinstance(cache, PagedKVCache) or pages is not None:
      return self._paged_hidden_states(input_ids, cache, pages, routed_experts, positions, inputs_embeds)
    if cache is None:
      if cache_index is not None:
        raise ValueError("cache_index was given without cache")
      if attention_mask is not None:
        chex.assert_shape(attention_mask, (b, t))
      if segment_ids is not None:
        chex.assert_shape(segment_ids, (b, t))
      if cfg.attention_impl == "pallas":  # the kernel masks by segment ids (causal within a segment)
        mask = segment_ids_for(attention_mask, segment_ids, (b, t))
      else:
        mask = build_attention_mask(b, t, attention_mask=attention_mask, segment_ids=segment_ids)
      if positions is None:
        if segment_ids is not None:
          positions = segment_positions(segment_ids)
        elif attention_mask is None:
          positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        else:
          positions = jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)
    else:
      if segment_ids is not None:
        raise ValueError("segment_ids (packed rows) are not supported with a cache")
      if not isinstance(cache, KVCache) or cache.num_layers != cfg.num_hidden_layers:
        raise ValueError(f"cache must be a KVCache with {cfg.num_hidden_layers} layers (model.init_cache)")
      if cache.stacked != cfg.scan_layers:
        raise ValueError(
          f"cache is {'stacked' if cache.stacked else 'per layer'} but the model has "
          f"scan_layers={cfg.scan_layers} (use model.init_cache)"
        )
      if cache.batch_size != b:
        raise ValueError(f"cache batch size {cache.batch_size} != input_ids batch size {b}")
      if attention_mask is not None:
        chex.assert_shape(attention_mask, (b, cache.max_len))
      if from_empty_cache:
        if cache_index is not None:
          raise ValueError("from_empty_cache writes slots [0, T): give no cache_index")
        if t > cache.max_len:
          raise ValueError(f"{t} tokens do not fit a cache of {cache.max_len} slots")
        prompt_mask = None if attention_mask is None else attention_mask[:, :t]
        if cfg.attention_impl == "pallas":
          mask = segment_ids_for(prompt_mask, None, (b, t))
        else:
          mask = build_attention_mask(b, t, attention_mask=prompt_mask)
        start = 0
      else:
        cache_index = jnp.asarray(0 if cache_index is None else cache_index, jnp.int32)
        chex.assert_rank(cache_index, 0)
        mask = build_attention_mask(
          b, t, attention_mask=attention_mask, cache_len=cache.max_len, cache_index=cache_index
        )
        start = cache_index
      if positions is None:
        positions = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
    if positions.ndim == 3:
      chex.assert_shape(positions, (3, b, t))
    else:
      chex.assert_shape(positions, (b, t))
    cos, sin = position_tables(positions, cfg)
    if inputs_embeds is None:
      inputs_embeds = embed_lookup(self.model.embed_tokens, input_ids, cfg.compute_dtype)
    x = constrain(inputs_embeds, HIDDEN_AXES)
    route_in = self._route_inputs(routed_experts, b, t)
    if cfg.scan_layers:
      x, (kv, routes) = scan_decoder_layers(
        self.model.layers, x, cos, sin, mask, cache, cache_index, cfg.remat, cfg.compute_dtype, routed_experts
      )
      new_cache = None if cache is None else KVCache(k=kv[0], v=kv[1], num_kv_heads=cache.num_kv_heads)
      return constrain(self.model.norm(x), HIDDEN_AXES), new_cache, self._stack_routes(routes)
    new_k, new_v, routes = [], [], []
    for i, layer in enumerate(self.model.layers):
      kv = None if cache is None else (cache.k[i], cache.v[i])
      graphdef, state = nnx.split(layer)  # remat policy per decoder layer (models/remat.py)
      call = checkpointed(functools.partial(_apply_layer, graphdef), cfg.remat)
      x, kv, route = call(state, x, cos, sin, mask, kv, cache_index, route_in[i])
      routes.append(route)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
    x = constrain(self.model.norm(x), HIDDEN_AXES)
    new_cache = None if cache is None else KVCache(k=tuple(new_k), v=tuple(new_v), num_kv_heads=cache.num_kv_heads)
    return x, new_cache, self._stack_routes(routes)

  def _paged_hidden_states(
    self, input_ids, cache: PagedKVCache, pages: PageTable, routed_experts=None, positions=None, inputs_embeds=None
  ):
    """hidden_states over a paged cache: (hidden [B, T, D], the updated PagedKVCache, routes or None).
    `positions` int32[B, T] or [3, B, T] (M-RoPE): the RoPE positions when they differ from the cache slots'
    (pages.positions, the default); `inputs_embeds` [B, T, D]: in place of input_ids' embedding rows."""
    cfg = self.config
    if not isinstance(cache, PagedKVCache) or not isinstance(pages, PageTable):
      raise ValueError("a paged forward needs cache=PagedKVCache (model.init_paged_cache) and pages=PageTable")
    heads_first = cache_heads_first(cfg.attention_impl)
    if (
      cache.num_layers != cfg.num_hidden_layers or cache.stacked != cfg.scan_layers or cache.heads_first != heads_first
    ):
      raise ValueError(
        f"the paged cache has {cache.num_layers} layers ({'stacked' if cache.stacked else 'per layer'}, "
        f"heads_first={cache.heads_first}); the model has {cfg.num_hidden_layers} (scan_layers={cfg.scan_layers}, "
        f"attention_impl={cfg.attention_impl!r}): use model.init_paged_cache"
      )
    chex.assert_equal_shape([input_ids, pages.positions, pages.write_slots])
    b, t = input_ids.shape
    if positions is not None:
      chex.assert_shape(positions, (3, b, t) if positions.ndim == 3 else (b, t))
    cos, sin = position_tables(pages.positions if positions is None else positions, cfg)
    if inputs_embeds is None:
      inputs_embeds = embed_lookup(self.model.embed_tokens, input_ids, cfg.compute_dtype)
    x = constrain(inputs_embeds, HIDDEN_AXES)
    route_in = self._route_inputs(routed_experts, b, t)
    if cfg.scan_layers:
      x, (kv, routes) = scan_paged_layers(self.model.layers, x, cos, sin, pages, cache, cfg.remat, routed_experts)
      return (
        constrain(self.model.norm(x), HIDDEN_AXES),
        PagedKVCache(kv[0], kv[1], heads_first),
        self._stack_routes(routes),
      )
    new_k, new_v, routes = [], [], []
    for i, layer in enumerate(self.model.layers):
      out = layer(x, cos, sin, pages, (cache.k[i], cache.v[i]), None, route_in[i])
      x, (k, v) = out[0], out[1]
      routes.append(out[2] if len(out) == 3 else None)
      new_k.append(k)
      new_v.append(v)
    return (
      constrain(self.model.norm(x), HIDDEN_AXES),
      PagedKVCache(tuple(new_k), tuple(new_v), heads_first),
      self._stack_routes(routes),
    )


class CausalLM(_Base):
  """Decoder-only causal LM (Qwen2/Qwen2.5, Qwen3, Llama 3 families)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.model = Transformer(cfg, rngs=rngs)
    if cfg.tie_word_embeddings:
      self.lm_head = None
    else:
      self.lm_head = linear(cfg, cfg.hidden_size, cfg.vocab_size, False, rngs, axes=("embed", "vocab"))

  def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
    """hidden [..., D] -> float32 logits [..., V] (tied: hidden @ embedding.T)."""
    if self.lm_head is None:
      emb = self.model.embed_tokens.embedding[...].astype(self.config.compute_dtype)
      logits = jnp.einsum(
        "...d,vd->...v", hidden.astype(self.config.compute_dtype), emb, precision=self.config.matmul_precision
      )
    else:
      logits = self.lm_head(hidden)
    if logits.ndim >= 2:
      logits = constrain(logits, ("act_batch",) + ("act_length",) * (logits.ndim - 2) + ("act_vocab",))
    return logits.astype(jnp.float32)

  def next_token_logits(self, hidden: jax.Array) -> jax.Array:
    """`logits_from_hidden` with the tokens the model never writes (ModelConfig.placeholder_token_ids) at
    probability 0: what a sampler draws from (the trainer's log-probs use the same softmax)."""
    return suppress_logits(self.logits_from_hidden(hidden), self.config.placeholder_token_ids)

  def token_logprobs_entropy(
    self,
    hidden: jax.Array,
    targets: jax.Array,
    *,
    temperature: float = 1.0,
    chunk: int = 256,
    loss_mask: jax.Array | None = None,
    capacity=(),
  ) -> tuple[jax.Array, jax.Array]:
    """hidden [B, T, D], targets int[B, T] -> (log-prob of each target, entropy) float32[B, T] under
    softmax(logits / temperature), without materialising the [B, T, V] logits (see token_stats).
    With `loss_mask` bool[B, T] and `capacity` (a fraction of T in (0, 1), or a sequence of
    them): computed only on the mask's positions, 0 elsewhere (`at_loss_positions`)."""
    if self.lm_head is None:
      weight, vocab_major = self.model.embed_tokens.embedding[...], True
    else:
      weight, vocab_major = self.lm_head.kernel[...], self.lm_head.kernel_layout == "out_in"

    def stats(h, tgt):
      return chunked_logprobs_entropy(
        h.astype(self.config.compute_dtype),
        weight,
        tgt,
        temperature=temperature,
        chunk=chunk,
        vocab_major=vocab_major,
        precision=self.config.matmul_precision,
        suppress=self.config.placeholder_token_ids,
      )

    if loss_mask is None or not capacity_fractions(capacity):
      return stats(hidden, targets)
    return at_loss_positions(stats, hidden, targets, loss_mask, capacity)

  def __call__(
    self,
    input_ids,
    *,
    positions=None,
    attention_mask=None,
    cache=None,
    cache_index=None,
    segment_ids=None,
    pixel_values=None,
    image_grid_thw=None,
  ):
    """Forward pass.

    Args:
      input_ids: int32[B, T].
      positions: int32[B, T] RoPE positions. Default: without a cache, arange(T), or (with
        attention_mask) the count of real tokens before each position; with a cache,
        cache_index + arange(T).
      attention_mask: without a cache bool[B, T] padding mask (True = real token); with a cache
        bool[B, max_len] marking valid cache slots.
      cache: a KVCache (from `init_cache`); the new keys/values go to slots
        [cache_index, cache_index + T).
      cache_index: int32 scalar write offset into the cache (same for the whole batch).
      segment_ids: int[B, T] (no cache): packed rows, several sequences per row; a token attends
        only to earlier tokens of its own segment, and default positions restart at 0 per segment.
      pixel_values, image_grid_thw: images (a vision-language model only: models/qwen25_vl.py).

    Returns:
      logits float32[B, T, V]; with a cache, (logits, new_cache).
    """
    hidden, new_cache = self.hidden_states(
      input_ids,
      positions=positions,
      attention_mask=attention_mask,
      cache=cache,
      cache_index=cache_index,
      segment_ids=segment_ids,
      pixel_values=pixel_values,
      image_grid_thw=image_grid_thw,
    )
    logits = self.logits_from_hidden(hidden)
    return logits if cache is None else (logits, new_cache)


class Critic(_Base):
  """Value model: the CausalLM trunk + a linear value head `score` (HF *ForTokenClassification,
  num_labels=1). critic(input_ids, ...) -> float32[B, T]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.model = Transformer(cfg, rngs=rngs)
    self.score = linear(cfg, cfg.hidden_size, 1, True, rngs, axes=("embed", "score"))

  def __call__(self, input_ids, *, positions=None, attention_mask=None, cache=None, cache_index=None, segment_ids=None):
    """Per-token values float32[B, T] (with a cache: (values, new_cache)). Args as CausalLM."""
    hidden, new_cache = self.hidden_states(
      input_ids,
      positions=positions,
      attention_mask=attention_mask,
      cache=cache,
      cache_index=cache_index,
      segment_ids=segment_ids,
    )
    values = constrain(self.score(hidden)[..., 0].astype(jnp.float32), ("act_batch", "act_length"))
    return values if cache is None else (values, new_cache)

  @classmethod
  def from_causal_lm(cls, lm: CausalLM, *, rngs: nnx.Rngs | None = None) -> "Critic":
    """A critic whose trunk is a copy of `lm`'s trunk (warm start); the value head is fresh.
    Built abstractly first, so memory is the copy of the trunk, not an extra random trunk."""
    cfg = lm.config
    graphdef, state = nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))))
    trunk = dict(nnx.to_flat_state(nnx.state(lm.model)))
    head = dict(
      nnx.to_flat_state(nnx.state(linear(cfg, cfg.hidden_size, 1, True, rngs or nnx.Rngs(0), axes=("embed", "score"))))
    )
    flat = nnx.to_flat_state(state)
    for path, var in flat:
      source = trunk[path[1:]] if path[0] == "model" else head[path[1:]]
      var.set_value(jnp.copy(source[...]))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))
