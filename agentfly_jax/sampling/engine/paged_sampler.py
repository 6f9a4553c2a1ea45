"""PagedJaxSampler: the JAX sampler as a continuous-batching engine over a paged KV cache.

    sampler = PagedJaxSampler(model, num_slots=32, max_len=2048, page_size=16, kv_cache_gib=1.0)
    result = await sampler.agenerate(prompt_ids, params)   # trio; admitted at the next step boundary
    results = sampler.generate(prompts, params)            # the same engine, waited on from this thread
    sampler.update_weights(new_params)                     # lands between decode steps (weight_update mode)
    sampler.metrics(reset=True)                            # slot occupancy, pages, preemptions, waits, tok/s

The Sampler protocol, token-in/token-out and the log-prob convention are the JaxSampler's (it shares its
weight handling: kernel layouts, LoRA adapter sync, shape checks); what changes is how requests run: each
enters a free decode slot at a step boundary and leaves it when it stops (sampling/engine/scheduler.py),
its keys / values live in pages (models/paged_attention.py) shared by whole-page prefixes across turns and
across a group's chains (sampling/engine/pages.py). A request that can never fit the cache is refused.

With a vision-language model (Qwen2.5-VL) a request may carry images (`PromptImages`: pixel values + grids):
the vision tower runs once on them at admission, their features replace the image-pad tokens' embeddings in
whichever prefill chunks hold those tokens, the prompt takes M-RoPE positions and decoding text positions
(index + delta); pages holding image tokens are shared only with prompts of the same images
(sampling/engine/images.py).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import trio
from flax import nnx

from agentfly_jax.models import cpu_kernels
from agentfly_jax.models.paged_attention import ROW_GROUP, cache_shardings
from agentfly_jax.sampling.engine import programs
from agentfly_jax.sampling.engine.decode_layers import DECODE_LAYERS, ScannedTwin, scanned_twin
from agentfly_jax.sampling.engine.images import image_request
from agentfly_jax.sampling.engine.scheduler import WEIGHT_UPDATE_MODES, Engine, EngineConfig, Future
from agentfly_jax.sampling.jax_sampler import JaxSampler
from agentfly_jax.sampling.protocol import PromptImages, SampleResult, SamplingParams, SyncStats
from agentfly_jax.sampling.requests import per_request_params

log = logging.getLogger(__name__)


def pages_for_budget(kv_cache_gib: float, config, page_size: int, itemsize: int) -> int:
  """How many pages of `page_size` tokens fit `kv_cache_gib` GiB for a model config (keys + values, all layers)."""
  per_page = 2 * config.num_hidden_layers * page_size * config.num_key_value_heads * config.head_dim * itemsize
  return int(kv_cache_gib * 2**30 // per_page)


def decode_batch_sizes(num_slots: int) -> tuple[int, ...]:
  """The engine's default decode batch sizes for `num_slots` slots: 1, 2, 4, then multiples of
  paged_attention.ROW_GROUP (8) growing by at most a quarter (8, 16, 24, 32, 40, ..., 64, 80, 96, 112, 128,
  160, ...), then num_slots. A batch pads its rows up to the next size: with powers of two a decode call
  averaged 68-73 % real rows on SmolLM2's agentic workload, with these 83-85 %, and the engine ran it
  1.08-1.16x faster (lab/results/bench_rollout_engine_smollm2_rowgroups.md)."""
  sizes, b = [], 1
  while b < min(num_slots, ROW_GROUP):
    sizes.append(b)
    b *= 2
  while b < num_slots:
    sizes.append(b)
    b += max(ROW_GROUP, (1 << (b.bit_length() - 1)) // 4)
  return (*sizes, num_slots)


def engine_config(
  cfg,
  *,
  num_slots: int,
  max_len: int,
  page_size: int = 16,
  kv_cache_pages: int | None = None,
  kv_cache_gib: float | None = None,
  prefill_tokens: int = 128,
  prefill_chunks: Sequence[int] = (8, 32, 128),
  decode_batches: Sequence[int] | None = None,
  attention_block_pages: int = 8,
  decode_steps: int = 4,
  stop_width: int = 16,
  weight_update: str = "drain",
  batch_invariant: bool = False,
) -> EngineConfig:
  """The static sizes of an engine for a model config `cfg` (PagedJaxSampler's arguments, checked; the AOT
  tool's engine rows read the same: rl/scale/aot_engine.py)."""
  for name, value, low in (
    ("num_slots", num_slots, 1),
    ("page_size", page_size, 1),
    ("prefill_tokens", prefill_tokens, 1),
    ("decode_steps", decode_steps, 1),
    ("stop_width", stop_width, 1),
    ("attention_block_pages", attention_block_pages, 1),
  ):
    if not isinstance(value, int) or value < low:
      raise ValueError(f"PagedJaxSampler: {name} must be an int >= {low}, got {value!r}")
  if weight_update not in WEIGHT_UPDATE_MODES:
    raise ValueError(f"PagedJaxSampler: weight_update must be one of {WEIGHT_UPDATE_MODES}, got {weight_update!r}")
  chunks = tuple(sorted({int(c) for c in prefill_chunks}))
  if not chunks or chunks[0] < 1:
    raise ValueError(f"PagedJaxSampler: prefill_chunks must be positive sizes, got {tuple(prefill_chunks)}")
  if batch_invariant:
    if weight_update != "drain":
      raise ValueError(
        "PagedJaxSampler: batch_invariant needs weight_update='drain' (a recompute re-prefills rows in flight at "
        "whatever token the update finds them: their keys then differ in rounding from the decode steps')"
      )
    if decode_batches is not None and tuple(decode_batches) != (num_slots,):
      raise ValueError(
        f"PagedJaxSampler: batch_invariant decodes every batch at num_slots={num_slots} rows; decode_batches="
        f"{tuple(decode_batches)} asks for other sizes (leave it unset)"
      )
    decode_batches, chunks = (num_slots,), chunks[-1:]  # one shape per program
  batches = JaxSampler._check_buckets(decode_batches or decode_batch_sizes(num_slots), num_slots, "decode_batches")
  max_pages = -(-max_len // page_size)
  if kv_cache_pages is not None and kv_cache_gib is not None:
    raise ValueError("PagedJaxSampler: give kv_cache_pages or kv_cache_gib, not both")
  if kv_cache_gib is not None:
    import jax.numpy as jnp

    budget = pages_for_budget(kv_cache_gib, cfg, page_size, jnp.dtype(cfg.compute_dtype).itemsize)
    if budget < max_pages + 1:
      raise ValueError(
        f"PagedJaxSampler: kv_cache_gib={kv_cache_gib} holds {budget} pages of {page_size} tokens; one sequence "
        f"of max_len={max_len} needs {max_pages} (+ the sink page): raise kv_cache_gib or lower max_len"
      )
    kv_cache_pages = min(budget, num_slots * max_pages + 1)  # never more than every slot at max_len needs
  if kv_cache_pages is None:
    kv_cache_pages = num_slots * max_pages + 1
  if kv_cache_pages < 2:
    raise ValueError(f"PagedJaxSampler: the KV cache needs at least 2 pages (page 0 is the sink), got {kv_cache_pages}")
  if batch_invariant and kv_cache_pages < num_slots * max_pages + 1:
    raise ValueError(
      f"PagedJaxSampler: batch_invariant needs a cache where no row is ever preempted (a recompute's keys differ "
      f"in rounding from the decode steps'): {num_slots * max_pages + 1} pages for num_slots={num_slots} at "
      f"max_len={max_len}, got {kv_cache_pages} (kv_cache_pages / kv_cache_gib: raise it, or leave it unset)"
    )
  return EngineConfig(
    num_slots=num_slots,
    num_pages=int(kv_cache_pages),
    page_size=page_size,
    max_len=max_len,
    prefill_tokens=prefill_tokens,
    prefill_chunks=chunks,
    decode_batches=batches,
    table_width=-(-max_pages // attention_block_pages) * attention_block_pages,
    block_pages=attention_block_pages,
    decode_steps=decode_steps,
    stop_width=stop_width,
    weight_update=weight_update,
    batch_invariant=bool(batch_invariant),
  )


def _decode_twin(model, decode_layers: str, kernel_layout: str, mesh) -> ScannedTwin | None:
  """The scanned twin the engine decodes on (None: the policy's own layout); see `decode_layers`."""
  if decode_layers not in DECODE_LAYERS:
    raise ValueError(f"PagedJaxSampler: decode_layers must be one of {DECODE_LAYERS}, got {decode_layers!r}")
  if decode_layers == "model" or getattr(getattr(model, "config", None), "scan_layers", True):
    return None
  on_mesh = mesh is not None and mesh.size > 1
  if decode_layers == "auto":
    layout = cpu_kernels.decode_layout() if kernel_layout == "auto" else kernel_layout
    if on_mesh or layout == "in_out":
      return None  # the decode copy would be a second copy of the weights: keep the policy's layout
    try:
      return scanned_twin(model, nnx.split(model, nnx.Param, ...)[2])
    except ValueError as e:
      log.info("PagedJaxSampler: decoding on the policy's unrolled layers (%s)", e)
      return None
  if on_mesh:
    raise ValueError(
      "PagedJaxSampler: decode_layers='scanned' on a mesh needs a scanned policy (model.scan_layers=True), "
      "so the stacked weights keep their shardings"
    )
  try:
    return scanned_twin(model, nnx.split(model, nnx.Param, ...)[2])
  except ValueError as e:
    raise ValueError(f"PagedJaxSampler: decode_layers='scanned' is not possible here: {e}") from e


class PagedJaxSampler(JaxSampler):
  """Implements the `Sampler` protocol with continuous batching over a paged KV cache.

  Args:
    model / tokenizer / seed / pad_id / kernel_layout / mesh / sharding_rules: as JaxSampler.
    num_slots: decode rows run together (requests beyond wait in the queue).
    max_len: a sequence's context (prompt + new tokens).
    page_size: tokens per page.
    kv_cache_pages / kv_cache_gib: the cache's size, in pages, or a budget in GiB (capped at what every slot at
      max_len needs); neither: every slot can hold max_len tokens at once, so nothing is ever preempted. Page 0
      is the sink.
    prefill_tokens / prefill_chunks: a prefill call's token budget and its chunk lengths (each chunk one shape:
      prefill_tokens // chunk rows of chunk tokens; the engine picks the one that writes the most tokens).
    decode_batches: decode batch sizes (default `decode_batch_sizes(num_slots)`: 1, 2, 4, then multiples of 8;
      the running rows are packed into the smallest that holds them).
    attention_block_pages: pages the attention loop gathers at a time (it visits the blocks up to the longest
      row's position only: models/paged_attention.paged_attend).
    decode_steps: decode steps per device call (stop checks on device each step; admission between calls).
    stop_width: most stop ids a request may carry.
    weight_update: "drain" (rows in flight finish on the weights they started with) or "recompute" (rows in
      flight continue on the new weights after recomputing their keys / values).
    batch_invariant: a request's tokens and log-probs depend on its prompt, seed and the weights only, not on
      which requests ran beside it or when it arrived (so a resumed run repeats an uninterrupted one bit for
      bit). XLA:CPU's matmuls round a row differently at different batch sizes (a row of a [M, 576] x
      [576, 1536] product moved by 5e-5 between M = 1, 2 and 40) though not by its place among M rows or by
      the other rows' values, so this decodes every batch at num_slots rows, prefills in one shape (the
      largest chunk), shares only the keys / values a prefill computed (a chain's next turn prefills the tokens
      it decoded; a page evicted and computed again comes back the same) and needs a cache that never preempts.
      Slower where batches run part full; dense models only (a mixture of experts' grouped matmuls depend on
      the batch's routing).
    vision_patch_multiple: a vision-language model's request patches are padded up to a multiple of this (one
      padding image, its features dropped), so the vision tower compiles once per bucket, not per image size.
    decode_layers: the layer layout the engine's programs run on (sampling/engine/decode_layers.py): "scanned"
      (decoder layers stacked under lax.scan: the programs compile one layer, not L), "model" (the policy's own
      layout), "auto" (scanned where the decode copy is a copy anyway: one device, the "out_in" kernel layout,
      no LoRA, layers alike; else the policy's own).
  """

  def __init__(
    self,
    model: nnx.Module,
    tokenizer: Any = None,
    *,
    num_slots: int = 32,
    max_len: int = 2048,
    page_size: int = 16,
    kv_cache_pages: int | None = None,
    kv_cache_gib: float | None = None,
    prefill_tokens: int = 128,
    prefill_chunks: Sequence[int] = (8, 32, 128),
    decode_batches: Sequence[int] | None = None,
    attention_block_pages: int = 8,
    decode_steps: int = 4,
    stop_width: int = 16,
    weight_update: str = "drain",
    batch_invariant: bool = False,
    vision_patch_multiple: int = 256,
    decode_layers: str = "auto",
    seed: int = 0,
    pad_id: int | None = None,
    kernel_layout: str = "auto",
    mesh=None,
    sharding_rules=None,
  ):
    self._twin = _decode_twin(model, decode_layers, kernel_layout, mesh)  # read by _decode_copy in __init__
    super().__init__(
      model,
      tokenizer,
      max_batch_size=num_slots,
      max_len=max_len,
      seed=seed,
      pad_id=pad_id,
      kernel_layout=kernel_layout,
      mesh=mesh,
      sharding_rules=sharding_rules,
    )
    self.engine_config = engine_config(
      model.config,
      num_slots=num_slots,
      max_len=self.max_len,
      page_size=page_size,
      kv_cache_pages=kv_cache_pages,
      kv_cache_gib=kv_cache_gib,
      prefill_tokens=prefill_tokens,
      prefill_chunks=prefill_chunks,
      decode_batches=decode_batches,
      attention_block_pages=attention_block_pages,
      decode_steps=decode_steps,
      stop_width=stop_width,
      weight_update=weight_update,
      batch_invariant=batch_invariant,
    )
    self._cache_dtype = model.config.compute_dtype
    self._model_for_cache = model if self._twin is None else self._twin.module
    self._decode_rest = self._rest if self._twin is None else self._twin.rest
    vcfg = model.config.vision
    if vcfg is not None and (vision_patch_multiple < 1 or vision_patch_multiple % vcfg.spatial_merge_size**2):
      raise ValueError(
        f"vision_patch_multiple={vision_patch_multiple} must be a positive multiple of spatial_merge_size**2 = "
        f"{vcfg.spatial_merge_size**2}"
      )
    self.vision_patch_multiple = vision_patch_multiple
    vision = self._run_vision if model.config.vision is not None else None
    cfg = model.config
    routes = (len(cfg.moe_layers), cfg.num_experts_per_tok) if getattr(cfg, "is_moe", False) else None
    if batch_invariant and routes is not None:
      raise ValueError(
        "PagedJaxSampler: batch_invariant is for dense models; a mixture of experts' grouped expert matmuls "
        "depend on how the batch's tokens route"
      )
    self.engine = Engine(
      self._run_prefill,
      self._run_decode,
      self._make_cache,
      self.engine_config,
      self._decode,
      run_vision=vision,
      routes=routes,
    )

  def _decode_copy(self, params: nnx.State):
    """(graphdef, params) the engine's programs run on: JaxSampler's, or the scanned twin's (decode_layers)."""
    if self._twin is None:
      return super()._decode_copy(params)
    return self._twin.decode_copy(params, self.kernel_layout)

  # ---------------------------------------------------------------- engine callables (engine thread)
  def _make_cache(self):
    """Zero pages; on a mesh of several devices replicated over it (the params' devices)."""
    c = self.engine_config
    cache = self._model_for_cache.init_paged_cache(c.num_pages, c.page_size, self._cache_dtype)
    if self.activation is None:
      return cache
    import jax

    mesh, rules = self.activation
    return jax.device_put(cache, cache_shardings(cache, mesh, dict(rules)))

  def _run_prefill(self, decode, cache, a: dict):
    graphdef, params = decode
    before = programs.TRACES[0]
    out = programs.prefill_chunk(
      graphdef, params, self._decode_rest, cache, a["tokens"], a["positions"], a["valid"], a["block_tables"],
      a["last_index"], a["temperature"], a["top_k"], a["top_p"], a["seeds"], a["steps"],
      a.get("rope_positions"), a.get("image_embeds"), a.get("image_mask"), a.get("routed"),
      page_size=self.engine_config.page_size, block_pages=self.engine_config.block_pages,
      activation=self.activation,
    )  # fmt: skip
    self.trace_count += programs.TRACES[0] - before
    return out

  def _run_decode(self, decode, cache, a: dict):
    graphdef, params = decode
    before = programs.TRACES[0]
    out = programs.decode_block(
      graphdef, params, self._decode_rest, cache, a["tokens"], a["positions"], a["block_tables"], a["live"],
      a["remaining"], a["stop_ids"], a["temperature"], a["top_k"], a["top_p"], a["seeds"], a["steps"],
      a.get("rope_delta"), page_size=self.engine_config.page_size, block_pages=self.engine_config.block_pages,
      num_steps=self.engine_config.decode_steps, activation=self.activation,
    )  # fmt: skip
    self.trace_count += programs.TRACES[0] - before
    return out

  def _run_vision(self, decode, request):
    """The merged features [M, D] of one ImageRequest's images on the decode params: its patches padded up to
    a multiple of vision_patch_multiple by one padding image (it attends to itself alone; its features, last,
    are dropped), so every request in a bucket runs the same compiled tower."""
    import numpy as np

    from agentfly_jax.models.vision import padded_layout

    graphdef, params = decode
    before = programs.TRACES[0]
    vcfg = self._model_for_cache.config.vision
    real = request.images.pixel_values
    size = -(-len(real) // self.vision_patch_multiple) * self.vision_patch_multiple
    layout, _ = padded_layout(request.images.image_grid_thw, size, vcfg)
    pixels = np.zeros((size, real.shape[1]), real.dtype)
    pixels[: len(real)] = real
    out = programs.image_features(graphdef, params, self._decode_rest, pixels, layout, activation=self.activation)
    self.trace_count += programs.TRACES[0] - before
    return out[: len(real) // vcfg.spatial_merge_size**2]

  def warmup(self) -> float:
    """Compiles (or loads from the compile cache) every program the engine can run: each prefill shape and
    each decode batch, on padding rows that write only the sink page. Returns the seconds it took."""
    import time

    import numpy as np

    c = self.engine_config
    start = time.perf_counter()

    def rows(n):
      return dict(
        temperature=np.ones((n,), np.float32),
        top_k=np.zeros((n,), np.int32),
        top_p=np.ones((n,), np.float32),
        seeds=np.zeros((n,), np.uint32),
        steps=np.zeros((n,), np.int32),
      )

    with self.engine.paused():
      cache = self.engine.take_cache()
      for chunk in c.prefill_chunks:
        r = max(1, c.prefill_tokens // chunk)
        zeros = np.zeros((r, chunk), np.int32)
        arrays = dict(tokens=zeros, positions=zeros, valid=np.zeros((r, chunk), bool), last_index=zeros[:, 0])
        table = np.zeros((r, c.table_width), np.int32)
        if self.engine.route_shape is not None:  # a mixture-of-experts model's prefill replays recorded routes
          arrays["routed"] = np.full((r, chunk, *self.engine.route_shape), -1, np.int32)
        cache = self._run_prefill(self._decode, cache, dict(arrays, block_tables=table, **rows(r)))[2]
      for b in c.decode_batches:
        zeros = np.zeros((b,), np.int32)
        arrays = dict(tokens=zeros, positions=zeros, live=np.zeros((b,), bool), remaining=zeros)
        arrays.update(
          block_tables=np.zeros((b, c.table_width), np.int32), stop_ids=np.full((b, c.stop_width), -1, np.int32)
        )
        cache = self._run_decode(self._decode, cache, dict(arrays, **rows(b)))[4]
      self.engine.put_cache(cache)
    return time.perf_counter() - start

  # ---------------------------------------------------------------- protocol
  def _image_request(self, prompt, params: SamplingParams, images: PromptImages | None, label: str):
    """The checked request's ImageRequest (None for text only); errors name `label`."""
    self._validate(prompt, params, label)
    return None if images is None else image_request(prompt, images, self._model_for_cache.config, label)

  @property
  def replays_prompt_routes(self) -> bool:
    """Whether `agenerate` takes `prompt_routes` (a mixture-of-experts policy: routes are recorded)."""
    return self.engine.route_shape is not None

  def _submit(
    self, prompt, params: SamplingParams, label: str, future: Future | None = None, image=None, prompt_routes=None
  ) -> Future:
    """Queues one request checked by `_image_request` (`image`: its ImageRequest, or None)."""
    if len(params.stop_token_ids) > self.engine_config.stop_width:
      raise ValueError(
        f"{label}: {len(params.stop_token_ids)} stop ids; the sampler takes at most stop_width="
        f"{self.engine_config.stop_width}"
      )
    (seed,) = self._row_seeds([params])
    return self.engine.submit(prompt, params, seed, future, image, prompt_routes)

  def generate(
    self,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams],
    images: Sequence[PromptImages | None] | None = None,
  ) -> list[SampleResult]:
    """One SampleResult per prompt, in order; `params` shared or one per prompt; `images` None or one entry per
    prompt (None: text only). Every request is checked before any is queued."""
    prompts = list(prompts)
    images = [None] * len(prompts) if images is None else list(images)
    if len(images) != len(prompts):
      raise ValueError(f"got {len(images)} images entries for {len(prompts)} prompts (need one per prompt, or None)")
    return self._generate_list(prompts, per_request_params(params, len(prompts)), images)

  def _generate_list(self, prompts: list, params_list: list, images: list | None = None) -> list[SampleResult]:
    images = images or [None] * len(prompts)
    requests = [
      self._image_request(p, q, im, f"request {i}") for i, (p, q, im) in enumerate(zip(prompts, params_list, images))
    ]
    futures = [
      self._submit(p, q, f"request {i}", image=r) for i, (p, q, r) in enumerate(zip(prompts, params_list, requests))
    ]
    return [f.wait() for f in futures]

  async def agenerate(
    self, prompt: Sequence[int], params: SamplingParams, images: PromptImages | None = None, prompt_routes=None
  ) -> SampleResult:
    """One request, admitted into a slot at the next step boundary; returns when its row stops. `prompt_routes`
    (a mixture-of-experts policy): int[n, Lm, k], the routes its first n prompt tokens were first computed with
    (a chain's earlier turns' SampleResult.routed_experts), replayed where those tokens are computed again (a
    prefix evicted from the cache, a preemption), so a chain's tokens keep one routing."""
    token = trio.lowlevel.current_trio_token()
    event = trio.Event()

    def wake():
      try:
        token.run_sync_soon(event.set)
      except trio.RunFinishedError:
        pass

    image = self._image_request(prompt, params, images, "agenerate request")
    future = self._submit(prompt, params, "agenerate request", Future(wake), image, prompt_routes)
    try:
      await event.wait()
    except BaseException:
      self.engine.cancel(future)
      raise
    return future.wait(0)

  def update_weights(self, params: Any) -> SyncStats:
    """As JaxSampler.update_weights; the new weights land in the engine at a step boundary
    (`weight_update`: drain or recompute) and every request submitted after this call runs on them."""
    stats = super().update_weights(params)
    self.engine.update_weights(self._decode)
    return stats

  def metrics(self, reset: bool = False) -> dict[str, float]:
    return self.engine.metrics(reset)

  def close(self) -> None:
    self.engine.close()
