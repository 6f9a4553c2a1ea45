"""The paged engine's programs (sampling/engine/programs.py) as AOT rows: `prefill_chunk` and `decode_block`
compiled from abstract values at the sizes the run's JAX sampler (`rollout.sampler=jax`, the paged engine) would use.

    rows = [compile_engine_prefill(run, chips), compile_engine_decode(run, chips)]   # AbstractRun of aot_programs

The sizes are `sampling/engine/paged_sampler.engine_config` of the run's rollout section (slots =
rollout.max_batch_size, context = rollout.max_len, kv_page_size, kv_cache_gib, decode_steps), so a row is the
program the sampler compiles. The cache is abstract too (`jax.eval_shape`), laid out as the model stores it
(heads first with attention_impl "pallas", whose decode steps run the Pallas paged-attention kernel) and
sharded as the sampler places it (`paged_attention.cache_shardings`: kv heads by act_kv_heads, pages whole on
every chip of the sampler's mesh). Each row records the cache's bytes a chip (`cache_bytes`, within the
argument bytes: the cache is an argument, donated, so it is also the aliased output).
"""

from __future__ import annotations

from agentfly_jax.rl.scale.aot_programs import GIB, AbstractRun, _sds, compile_program, per_device_bytes, with_shardings


def engine_sizes(run: AbstractRun):
  """The EngineConfig the run's JAX sampler (the paged engine) would build (rl/setup.py passes the same rollout fields)."""
  from agentfly_jax.sampling.engine.paged_sampler import engine_config

  r = run.spec.rollout
  return engine_config(
    run.cfg,
    num_slots=r.max_batch_size,
    max_len=r.max_len,
    page_size=r.kv_page_size,
    kv_cache_gib=r.kv_cache_gib or None,
    decode_steps=r.decode_steps,
    weight_update=r.weight_update,
    batch_invariant=r.batch_invariant,
  )


def _engine_parts(run: AbstractRun):
  """(engine config, a replicated sharding on the sampler's mesh, activation, the abstract cache with its shardings)."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P

  from agentfly_jax.models.paged_attention import PagedKVCache, cache_heads_first, cache_shardings
  from agentfly_jax.models.sharding import resolve_rules

  c, cfg = engine_sizes(run), run.cfg
  smesh = run.sampler_mesh or run.mesh
  activation = None if smesh.size <= 1 else (smesh, tuple(sorted(resolve_rules(run.rules).items())))
  cache = jax.eval_shape(
    lambda: PagedKVCache.zeros(
      cfg.num_hidden_layers,
      c.num_pages,
      c.page_size,
      cfg.num_key_value_heads,
      cfg.head_dim,
      cfg.compute_dtype,
      stacked=cfg.scan_layers,
      heads_first=cache_heads_first(cfg.attention_impl),
    )
  )
  cache = with_shardings(cache, cache_shardings(cache, smesh, run.rules))
  return c, NamedSharding(smesh, P()), activation, cache


def _finish(row: dict, c, cache, shape: str) -> dict:
  cache_bytes = per_device_bytes(cache)
  row.update(
    cache_bytes=cache_bytes,
    cache_pages=c.num_pages,
    page_size=c.page_size,
    micro_batch=f"{shape}; KV cache {c.num_pages} pages x {c.page_size} tokens, {cache_bytes / GIB:.2f} GiB a chip",
  )
  return row


def compile_engine_prefill(run: AbstractRun, chips: int) -> dict:
  """The `engine_prefill` row: one prefill chunk of the engine's largest chunk length (R = prefill_tokens //
  chunk rows), writing into the paged cache and sampling each row's next token."""
  import jax.numpy as jnp

  from agentfly_jax.sampling.engine import programs

  c, rep, activation, cache = _engine_parts(run)
  chunk = c.prefill_chunks[-1]
  rows = max(1, c.prefill_tokens // chunk)
  i32, f32 = jnp.int32, jnp.float32
  args = (
    _sds((rows, chunk), i32, rep),  # tokens
    _sds((rows, chunk), i32, rep),  # positions
    _sds((rows, chunk), jnp.bool_, rep),  # valid
    _sds((rows, c.table_width), i32, rep),  # block tables
    _sds((rows,), i32, rep),  # last_index
    _sds((rows,), f32, rep),  # temperature
    _sds((rows,), i32, rep),  # top_k
    _sds((rows,), f32, rep),  # top_p
    _sds((rows,), jnp.uint32, rep),  # seeds
    _sds((rows,), i32, rep),  # steps
  )
  if getattr(run.cfg, "is_moe", False):  # the recorded routes a recompute replays (rope / image arguments: None)
    routes = (len(run.cfg.moe_layers), run.cfg.num_experts_per_tok)
    args += (None, None, None, _sds((rows, chunk, *routes), i32, rep))
  row = compile_program(
    "engine_prefill",
    programs.prefill_chunk,
    run.graphdef,
    run.sampler_params,
    run.sampler_rest,
    cache,
    *args,
    page_size=c.page_size,
    block_pages=c.block_pages,
    activation=activation,
  )
  return _finish(row, c, cache, f"{rows}x{chunk} chunk, tables of {c.table_width} pages")


def compile_engine_decode(run: AbstractRun, chips: int) -> dict:
  """The `engine_decode` row: a block of decode_steps decode steps over every slot (the largest decode batch)."""
  import jax.numpy as jnp

  from agentfly_jax.sampling.engine import programs

  c, rep, activation, cache = _engine_parts(run)
  s = c.decode_batches[-1]
  i32, f32 = jnp.int32, jnp.float32
  args = (
    _sds((s,), i32, rep),  # pending tokens
    _sds((s,), i32, rep),  # positions
    _sds((s, c.table_width), i32, rep),  # block tables
    _sds((s,), jnp.bool_, rep),  # live
    _sds((s,), i32, rep),  # remaining
    _sds((s, c.stop_width), i32, rep),  # stop ids
    _sds((s,), f32, rep),  # temperature
    _sds((s,), i32, rep),  # top_k
    _sds((s,), f32, rep),  # top_p
    _sds((s,), jnp.uint32, rep),  # seeds
    _sds((s,), i32, rep),  # steps
  )
  row = compile_program(
    "engine_decode",
    programs.decode_block,
    run.graphdef,
    run.sampler_params,
    run.sampler_rest,
    cache,
    *args,
    page_size=c.page_size,
    block_pages=c.block_pages,
    num_steps=c.decode_steps,
    activation=activation,
  )
  return _finish(row, c, cache, f"{s} slots x {c.decode_steps} steps, tables of {c.table_width} pages")


COMPILERS = {"engine_prefill": compile_engine_prefill, "engine_decode": compile_engine_decode}
