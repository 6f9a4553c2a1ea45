"""The JAX sampler: batched left-padded prefill + KV-cache decode, each batch one jitted call.

    sampler = JaxSampler(model, max_batch_size=32, max_len=2048)
    results = sampler.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.8, max_new_tokens=64))
    result = await sampler.agenerate([1, 2, 3], params)   # trio; concurrent callers share a batch
    sampler.update_weights(new_params)                    # an nnx.State of the policy's nnx.Params

Static shapes come from three bucket lists (batch, prompt length, new tokens), so requests whose
sizes fall in already-seen buckets never recompile (`trace_count` counts compilations). The whole
decode loop is a `lax.while_loop` that exits as soon as every row is done. Each row has its own
temperature / top-k / top-p / max_new_tokens / stop ids / seed. Log-probs follow the convention in
`agentfly_jax.sampling.next_token` (the distribution the token was drawn from; at temperature T
with no truncation that is log_softmax(logits / T)).

Randomness: a row with `seed` set draws from key(seed) folded with the step number, so equal
seeds + equal inputs give equal outputs, independent of which other rows share the batch (up to
float differences between batch shapes). Rows without a seed get one from the sampler's own
numpy generator (seeded by `seed=` at construction), so a fresh sampler replays the same calls.

Kernel layout: on CPU the sampler decodes from its own copy of the weights with every Linear
kernel stored [out, in] (`kernel_layout="auto"`; see `models.layers.Linear`): XLA's CPU GEMMs at
decode batch sizes run faster on it. That costs one extra copy of the Linear weights and one
transpose pass per `update_weights`. On GPU / TPU (and with `kernel_layout="in_out"`) the sampler
keeps a reference to the given params instead, no copy.

Multi-turn prefix cache (`prefix_cache_tokens` > 0): each finished row's computed keys / values
are kept on the host (sampling/prefix_cache.py); a later prompt that starts with a kept one (a
chain's next turn: last prompt + reply + observation) prefills only its new tokens
(`decode.generate_rows_from_cache`). The jitted programs live in sampling/decode.py.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from agentfly_jax.models import cpu_kernels
from agentfly_jax.models.layers import KERNEL_LAYOUTS, set_kernel_layout
from agentfly_jax.models.sharding import resolve_rules
from agentfly_jax.sampling.batching import BatchingScheduler
from agentfly_jax.sampling.decode import TRACES, generate_rows, generate_rows_from_cache
from agentfly_jax.sampling.prefix_cache import PrefixStore, cached_batch, computed_rows
from agentfly_jax.sampling.protocol import SampleResult, SamplingParams, SyncStats, refuse_images
from agentfly_jax.sampling.requests import per_request_params, pick_bucket, power_of_two_buckets, validate_request


# Top-level modules a push may leave out: frozen, the sampler keeps its own (a vision tower a run does not train).
FROZEN_PARTS = ("visual",)


class JaxSampler:
  """Implements the `Sampler` protocol on a Flax NNX `CausalLM`.

  Args:
    model: an `agentfly_jax.models.CausalLM` (needs `init_cache` and the cached `__call__`).
    tokenizer: optional; only used for the default pad id.
    max_batch_size: most rows per jitted call (bigger requests are split).
    max_len: context length: prompt + new tokens never exceed it.
    batch_buckets / prompt_buckets / new_token_buckets: static sizes; defaults are powers of two
      (batch from 1, prompts and new tokens from 16). The maximum (max_batch_size, max_len) is
      always added, so any request fits some bucket.
    seed: seeds the generator of per-row seeds for requests without `seed`.
    max_wait_s: how long `agenerate` waits to gather concurrent requests into a batch.
    pad_id: token used for left padding (never attended to).
    kernel_layout: "auto" (CPU: "out_in", else "in_out"), "in_out" (decode straight from the
      given params) or "out_in" (decode from a copy with transposed Linear kernels).
    mesh / sharding_rules: the mesh the model's params live on; on several devices the decode's
      activations are constrained by the rules' act_* names (models/sharding.py).
    prefix_cache_tokens: 0 (off), or how many tokens of computed keys / values to keep on the host
      across calls (sampling/prefix_cache.py): a prompt that starts with a stored one (a chain's
      next turn) prefills only its new tokens. Cleared by `update_weights`.
  """

  def __init__(
    self,
    model: nnx.Module,
    tokenizer: Any = None,
    *,
    max_batch_size: int = 32,
    max_len: int = 2048,
    batch_buckets: Sequence[int] | None = None,
    prompt_buckets: Sequence[int] | None = None,
    new_token_buckets: Sequence[int] | None = None,
    seed: int = 0,
    max_wait_s: float = 0.005,
    pad_id: int | None = None,
    kernel_layout: str = "auto",
    mesh=None,
    sharding_rules=None,
    prefix_cache_tokens: int = 0,
  ):
    if max_batch_size < 1 or max_len < 2:
      raise ValueError(f"JaxSampler: need max_batch_size >= 1 and max_len >= 2, got {max_batch_size}, {max_len}")
    self.tokenizer = tokenizer
    self.max_batch_size = int(max_batch_size)
    self.max_len = int(max_len)
    self.batch_buckets = self._check_buckets(
      batch_buckets or power_of_two_buckets(1, self.max_batch_size), self.max_batch_size, "batch_buckets"
    )
    self.prompt_buckets = self._check_buckets(
      prompt_buckets or power_of_two_buckets(min(16, self.max_len), self.max_len), self.max_len, "prompt_buckets"
    )
    self.new_token_buckets = self._check_buckets(
      new_token_buckets or power_of_two_buckets(min(16, self.max_len), self.max_len), self.max_len, "new_token_buckets"
    )
    config = getattr(model, "config", None) or getattr(model, "cfg", None)
    self.vocab_size = getattr(config, "vocab_size", None)
    if pad_id is None:
      pad_id = getattr(tokenizer, "pad_token_id", None) or 0
    self.pad_id = int(pad_id)
    if kernel_layout == "auto":
      kernel_layout = cpu_kernels.decode_layout()
    if kernel_layout not in KERNEL_LAYOUTS:
      raise ValueError(f"JaxSampler: kernel_layout must be 'auto' or one of {KERNEL_LAYOUTS}, got {kernel_layout!r}")
    self.kernel_layout = kernel_layout
    self.activation = (
      None if mesh is None or mesh.size <= 1 else (mesh, tuple(sorted(resolve_rules(sharding_rules).items())))
    )
    self._graphdef, self._params, self._rest = nnx.split(model, nnx.Param, ...)
    self._stacked_cache = bool(getattr(config, "scan_layers", False))
    if prefix_cache_tokens < 0:
      raise ValueError(f"JaxSampler: prefix_cache_tokens must be >= 0 (0 = off), got {prefix_cache_tokens}")
    self.prefix_store = PrefixStore(prefix_cache_tokens) if prefix_cache_tokens else None
    self._decode = self._decode_copy(self._params)  # (graphdef, params), replaced as one
    self._seed_rng = np.random.default_rng(seed)
    self._seed_lock = threading.Lock()
    self.trace_count = 0  # compilations triggered by this sampler's calls
    self.scheduler = BatchingScheduler(
      self._generate_list,
      max_batch_size=self.max_batch_size,
      max_wait_s=max_wait_s,
      validate=lambda prompt, params: self._validate(prompt, params, "agenerate request"),
    )

  @staticmethod
  def _check_buckets(buckets: Sequence[int], maximum: int, name: str) -> tuple[int, ...]:
    """Sorted, positive, capped at `maximum`; `maximum` itself is added so every size fits."""
    b = sorted({int(x) for x in buckets})
    if not b or b[0] < 1:
      raise ValueError(f"JaxSampler: {name} must be positive sizes, got {tuple(buckets)}")
    b = [x for x in b if x < maximum] + [maximum]
    return tuple(b)

  # ---------------------------------------------------------------- protocol
  def generate(
    self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams], images=None
  ) -> list[SampleResult]:
    """One SampleResult per prompt, in order. `params` is shared, or one per prompt. No images (the paged
    engine takes them)."""
    refuse_images(images, "JaxSampler (rollout.sampler=jax_static)")
    return self._generate_list(list(prompts), per_request_params(params, len(prompts)))

  async def agenerate(self, prompt: Sequence[int], params: SamplingParams, images=None) -> SampleResult:
    """One request; concurrent trio callers are batched (see `BatchingScheduler`)."""
    refuse_images([images], "JaxSampler (rollout.sampler=jax_static)")
    return await self.scheduler.submit(prompt, params)

  def update_weights(self, params: Any) -> SyncStats:
    """Uses `params` (an nnx.State of the policy's nnx.Params, or the module) from now on;
    returns the bytes it took in (LoRA adapters only: theirs).

    With kernel_layout "in_out" keeps a reference, no copy. With "out_in" (CPU default) makes
    the transposed copy of the Linear kernels now (about one host copy of those bytes) and keeps
    references to the rest. Sharded arrays keep their (transposed) shardings.
    """
    if isinstance(params, nnx.Module):
      params = nnx.state(params, nnx.Param)
    if self.prefix_store is not None:
      self.prefix_store.clear()  # the stored keys / values are the old weights'
    if _only_adapters(params):
      self._update_adapters(params)
      return SyncStats(bytes=_nbytes(params))
    new_struct, old_struct = jax.tree.structure(params), jax.tree.structure(self._params)
    if new_struct != old_struct:
      try:
        params = params.filter(nnx.Param)  # a full model state: keep the params
        new_struct = jax.tree.structure(params)
      except Exception:
        pass
    if new_struct != old_struct:
      params = self._with_held_rest(params)  # the trained part alone (a frozen vision tower): the rest as held
      new_struct = jax.tree.structure(params)
    if new_struct != old_struct:
      raise ValueError(
        "JaxSampler.update_weights: params do not match the sampler's model "
        f"(expected the tree of {old_struct.num_leaves} nnx.Param leaves, got "
        f"{new_struct.num_leaves} leaves)"
      )
    for path_new, (old, new) in zip(
      jax.tree.leaves_with_path(params), zip(jax.tree.leaves(self._params), jax.tree.leaves(params))
    ):
      if old.shape != new.shape:
        raise ValueError(
          f"JaxSampler.update_weights: param {jax.tree_util.keystr(path_new[0])} has "
          f"shape {new.shape}, the model has {old.shape}"
        )
    decode = self._decode_copy(params)
    self._params, self._decode = params, decode
    return SyncStats(bytes=_nbytes(params))

  def _with_held_rest(self, params: nnx.State) -> nnx.State:
    """`params` without a frozen vision tower (a run that trains the LM alone pushes what it trains) completed
    by the held tower; `params` itself otherwise (what it lacks is not all under FROZEN_PARTS, or it is no State)."""
    try:
      new = dict(nnx.to_flat_state(params))
    except Exception:  # noqa: BLE001 -- not a State: the caller's structure check names the mismatch
      return params
    held = dict(nnx.to_flat_state(self._params))
    missing = set(held) - set(new)
    if not new or not set(new) <= set(held) or not missing or any(p[0] not in FROZEN_PARTS for p in missing):
      return params
    held.update(new)
    return nnx.from_flat_state(held)

  def _update_adapters(self, adapters: nnx.State) -> None:
    """LoRA sync: replaces only the adapters (`nnx.LoRAParam`s, models/lora.py) in the held
    params and in the decode copy; the base and its transposed decode kernels stay as they are
    (the decode applies the adapters: x W + (x A) B * scale)."""
    held = dict(nnx.to_flat_state(self._params))
    graphdef, decode_params = self._decode
    decode = dict(nnx.to_flat_state(decode_params))
    new = dict(nnx.to_flat_state(adapters))
    mine = {p for p, v in held.items() if isinstance(v, nnx.LoRAParam)}
    if set(new) != mine:
      diff = sorted(set(new) ^ mine)[:3]
      raise ValueError(
        f"JaxSampler.update_weights: the adapters do not match the sampler's model's "
        f"({len(new)} given, {len(mine)} held; e.g. {['/'.join(map(str, p)) for p in diff]}): "
        "was it built with the same model.lora config?"
      )
    for path, var in new.items():
      if held[path].shape != var.shape:
        raise ValueError(
          f"JaxSampler.update_weights: adapter {'/'.join(map(str, path))} has shape "
          f"{var.shape}, the model has {held[path].shape}"
        )
      held[path] = var
      decode[path] = var
    self._params = nnx.from_flat_state(held)
    self._decode = (graphdef, nnx.from_flat_state(decode))

  def _decode_copy(self, params: nnx.State) -> tuple[Any, nnx.State]:
    """(graphdef, params) the jitted decode runs on: `params` itself for "in_out", else a merged
    model whose Linear kernels are transposed copies (the caller's arrays are not touched)."""
    if self.kernel_layout == "in_out":
      return self._graphdef, params
    model = set_kernel_layout(nnx.merge(self._graphdef, params, self._rest), self.kernel_layout)
    graphdef, decode_params, _ = nnx.split(model, nnx.Param, ...)
    return graphdef, decode_params

  @property
  def params(self) -> nnx.State:
    return self._params

  # ---------------------------------------------------------------- host side
  def _validate(self, prompt, params, label: str) -> None:
    validate_request(prompt, params, label=label, max_len=self.max_len, vocab_size=self.vocab_size)

  def _generate_list(self, prompts: list, params_list: list) -> list[SampleResult]:
    for i, (prompt, params) in enumerate(zip(prompts, params_list)):
      self._validate(prompt, params, f"request {i}")
    results: list[SampleResult] = []
    for start in range(0, len(prompts), self.max_batch_size):
      stop = start + self.max_batch_size
      results.extend(self._generate_chunk(prompts[start:stop], params_list[start:stop]))
    return results

  def _row_seeds(self, params_list: list) -> list[int]:
    with self._seed_lock:
      return [p.seed % 2**32 if p.seed is not None else int(self._seed_rng.integers(0, 2**32)) for p in params_list]

  def _generate_chunk(self, prompts: list, params_list: list) -> list[SampleResult]:
    seeds = self._row_seeds(params_list)  # drawn for the whole chunk first: the same with or without the store
    store = self.prefix_store
    if store is None:
      return self._generate_plain(prompts, params_list, seeds, keep=False)
    epoch = store.epoch
    hits = [store.lookup(p) for p in prompts]
    results: list = [None] * len(prompts)
    misses = [i for i, h in enumerate(hits) if h is None]
    hit_rows = [i for i, h in enumerate(hits) if h is not None]
    for rows, cached in ((misses, False), (hit_rows, True)):
      if not rows:
        continue
      sub = [[xs[i] for i in rows] for xs in (prompts, params_list, seeds, hits)]
      if cached:
        out = self._generate_cached(*sub, epoch)
      else:
        out = self._generate_plain(*sub[:3], keep=True, epoch=epoch)
      for i, result in zip(rows, out):
        results[i] = result
    return results

  def _row_arrays(self, prompts: list, params_list: list, seeds: list, b: int) -> tuple[tuple, int]:
    """The per-row sampling arrays of a batch of `b` rows in the programs' argument order
    (temperature, top_k, top_p, max_new, stop_ids, seeds; rows past len(prompts): padding, done
    from the start: max_new 0), and the new-token bucket."""
    lens = [len(p) for p in prompts]
    max_new = [min(p.max_new_tokens, self.max_len - l) for p, l in zip(params_list, lens)]
    n_stop = pick_bucket(
      max(1, max(len(p.stop_token_ids) for p in params_list)), (8, 64, 512, 1 << 30), "number of stop ids"
    )
    temperature, top_p = np.zeros((b,), np.float32), np.ones((b,), np.float32)
    top_k, row_max_new = np.zeros((b,), np.int32), np.zeros((b,), np.int32)
    stop_ids, row_seeds = np.full((b, n_stop), -1, np.int32), np.zeros((b,), np.uint32)
    row_seeds[: len(seeds)] = seeds
    for i, params in enumerate(params_list):
      stop_ids[i, : len(params.stop_token_ids)] = params.stop_token_ids
      temperature[i], top_k[i], top_p[i], row_max_new[i] = params.temperature, params.top_k, params.top_p, max_new[i]
    rows = (temperature, top_k, top_p, row_max_new, stop_ids, row_seeds)
    return rows, pick_bucket(max(max_new), self.new_token_buckets, "max new tokens")

  def _run(self, program, *args, n: int, n_new: int, **kwargs) -> tuple[list[SampleResult], tuple]:
    """Runs a decode.py program on the decode params; (the first `n` rows' results, its outputs)."""
    traces_before = TRACES[0]
    decode_graphdef, decode_params = self._decode
    out = program(
      decode_graphdef, decode_params, self._rest, *args, num_new_bucket=n_new, activation=self.activation, **kwargs
    )
    tokens, logprobs, num_new, stopped = jax.device_get(out[:4])
    self.trace_count += TRACES[0] - traces_before
    return _results(tokens, logprobs, num_new, stopped, n), out

  def _generate_plain(
    self, prompts: list, params_list: list, seeds: list, *, keep: bool, epoch: int = 0
  ) -> list[SampleResult]:
    """Prefills the whole (left-padded) prompts; `keep`: store the rows' computed prefixes."""
    n = len(prompts)
    lens = [len(p) for p in prompts]
    b = pick_bucket(n, self.batch_buckets, "batch size")
    p_len = pick_bucket(max(lens), self.prompt_buckets, "prompt length")
    rows, n_new = self._row_arrays(prompts, params_list, seeds, b)
    ids = np.full((b, p_len), self.pad_id, np.int32)
    prompt_lens = np.ones((b,), np.int32)
    for i, prompt in enumerate(prompts):
      ids[i, p_len - lens[i] :] = prompt
      prompt_lens[i] = lens[i]
    results, out = self._run(generate_rows, ids, prompt_lens, *rows, n=n, n_new=n_new, return_cache=keep)
    if keep:
      self.prefix_store.stats.prefilled_tokens += sum(lens)
      kv_mask = np.arange(p_len + n_new)[None, :] >= (p_len - prompt_lens)[:, None]
      self._keep(out[4], kv_mask, prompts, results, p_len, epoch)
    return results

  def _generate_cached(
    self, prompts: list, params_list: list, seeds: list, hits: list, epoch: int
  ) -> list[SampleResult]:
    """Prefills only what follows each row's stored prefix (see sampling/prefix_cache.py)."""
    n = len(prompts)
    lens = [len(p) for p in prompts]
    p_len = pick_bucket(max(lens), self.prompt_buckets, "prompt length")
    u_len = pick_bucket(max(l - h.length for l, h in zip(lens, hits)), self.prompt_buckets, "suffix length")
    if u_len >= p_len:  # no room for a prefix at this bucket: prefill whole
      return self._generate_plain(prompts, params_list, seeds, keep=True, epoch=epoch)
    b = pick_bucket(n, self.batch_buckets, "batch size")
    rows, n_new = self._row_arrays(prompts, params_list, seeds, b)
    batch = cached_batch(
      hits, prompts, batch=b, prompt_slots=p_len, suffix_slots=u_len, new_slots=n_new, pad_id=self.pad_id
    )
    cache = batch.kv_cache(self._stacked_cache)
    kv_mask, suffix_ids, suffix_positions = batch.kv_mask, batch.suffix_ids, batch.suffix_positions
    del batch  # its host k / v: the device cache is the one copy the programme reads (donated)
    prompt_lens = np.ones((b,), np.int32)
    prompt_lens[:n] = lens
    reused = int(sum(min(h.length, p_len - u_len) for h in hits))
    self.prefix_store.stats.reused_tokens += reused
    self.prefix_store.stats.prefilled_tokens += sum(lens) - reused
    results, out = self._run(
      generate_rows_from_cache, cache, kv_mask, suffix_ids, suffix_positions, prompt_lens, *rows, n=n, n_new=n_new
    )
    self._keep(out[4], kv_mask, prompts, results, p_len, epoch)
    return results

  def _keep(self, cache, kv_mask, prompts: list, results: list, p_len: int, epoch: int) -> None:
    """Stores each row's computed prefix (prompt + fed new tokens) in the prefix store (unless
    the weights changed since the batch started: `epoch`)."""
    if epoch != self.prefix_store.epoch:
      return
    for tokens, k, v in computed_rows(cache, kv_mask, prompts, [r.token_ids for r in results], p_len):
      self.prefix_store.insert(tokens, k, v, epoch=epoch)


def _results(tokens, logprobs, num_new, stopped, n: int) -> list[SampleResult]:
  return [
    SampleResult(
      token_ids=tokens[i, : num_new[i]].tolist(),
      logprobs=logprobs[i, : num_new[i]].tolist(),
      finish_reason="stop" if stopped[i] else "length",
    )
    for i in range(n)
  ]


def _only_adapters(params) -> bool:
  """Whether `params` is an nnx.State holding LoRA adapters and nothing else."""
  if not isinstance(params, nnx.State):
    return False
  flat = nnx.to_flat_state(params)
  return len(flat) > 0 and all(isinstance(v, nnx.LoRAParam) for _, v in flat)


def _nbytes(tree) -> int:
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))
